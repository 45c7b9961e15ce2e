"""prepare_data_loader(torch_device_mesh=...): the same batches across tp/cp ranks, sharded across dp ranks.

In one process the rule is checked with a stand-in mesh (a DeviceMesh needs a process group); on
4 real processes (gloo) each rank's batches are compared with those Accelerate's own
prepare_data_loader gives for the same mesh (tests/scripts/mesh_loader.py under both libraries).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from hasten.data import prepare_data_loader
from hasten.data.dispatch import DispatchedDataLoader
from hasten.data.mesh import data_parallel_share, dispatch_layout, mesh_dim_sizes, mesh_loader_share


class Mesh:
    """A stand-in for a named DeviceMesh: the two things the rule reads."""

    def __init__(self, **sizes: int) -> None:
        self.mesh_dim_names = tuple(sizes)
        self._sizes = tuple(sizes.values())

    def size(self, dim: int) -> int:
        return self._sizes[dim]


def _batches(loader) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def _prepared(mesh: Mesh, rank: int, n: int = 12, batch_size: int = 2, **kwargs):
    return prepare_data_loader(DataLoader(list(range(n)), batch_size=batch_size), num_processes=4, process_index=rank,
                               torch_device_mesh=mesh, **kwargs)


# -- the rule ----------------------------------------------------------------------------------------------------------
def test_processes_of_one_tensor_or_context_group_share_a_data_parallel_index():
    assert [data_parallel_share({"dp_shard": 2, "tp": 2}, rank) for rank in range(4)] == [(2, 0), (2, 0), (2, 1), (2, 1)]
    assert [data_parallel_share({"dp_replicate": 2, "cp": 2}, rank) for rank in range(4)] == [(2, 0), (2, 0), (2, 1), (2, 1)]
    assert data_parallel_share({"dp_replicate": 2, "dp_shard": 2}, 3) == (4, 3)
    assert data_parallel_share({"tp": 4}, 3) == (1, 0)
    assert data_parallel_share({"dp_shard": 2, "sp": 2}, 3, same_batch=("tp", "cp", "sp")) == (2, 1)


def test_the_fsdp_strategy_shards_loaders_by_the_same_rule():
    from hasten.strategies.fsdp.strategy import FSDPStrategy
    from hasten.strategies.parallel.mesh import ParallelismConfig

    strategy = FSDPStrategy.__new__(FSDPStrategy)  # only the layout is asked for: no process group needed
    strategy.parallelism_config = ParallelismConfig(dp_shard_size=2, tp_size=2)
    assert [strategy.data_parallel_layout(4, rank) for rank in range(4)] == [(2, 0), (2, 0), (2, 1), (2, 1)]
    strategy.parallelism_config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, cp_size=2)
    assert [strategy.data_parallel_layout(8, rank)[1] for rank in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_a_mesh_is_read_by_its_dimension_names():
    assert mesh_dim_sizes(Mesh(dp_shard=2, tp=3)) == {"dp_shard": 2, "tp": 3}
    with pytest.raises(ValueError, match="named dimensions"):
        mesh_dim_sizes(Mesh())


def test_under_deepspeed_only_tp_is_read_as_in_accelerate():
    mesh = Mesh(dp=2, tp=2)
    assert [mesh_loader_share(mesh, 4, rank, deepspeed=True) for rank in range(4)] == [(2, 0), (2, 0), (2, 1), (2, 1)]


def test_a_dim_accelerate_does_not_read_is_kept_together_with_a_warning():
    with pytest.warns(UserWarning, match=r"\['dp'\].*name a data-parallel dim dp_shard"):
        assert mesh_loader_share(Mesh(dp=2, tp=2), 4, 3) == (1, 1)


def test_a_mesh_that_leaves_a_process_without_a_data_group_is_refused_in_one_sentence():
    for rank in range(4):  # every process alike: none goes on to a collective the others never reach
        with pytest.raises(ValueError, match=r"2 data-parallel groups but puts processes in groups up to 3, because "
                                             r"its dims \['sp'\]"):
            mesh_loader_share(Mesh(dp_shard=2, sp=2), 4, rank)


# -- prepare_data_loader with a mesh, in one process ---------------------------------------------------------------
def test_tensor_parallel_ranks_read_the_same_batches_and_data_parallel_ranks_different_ones():
    mesh = Mesh(dp_shard=2, tp=2)
    seen = [_batches(_prepared(mesh, rank)) for rank in range(4)]
    assert seen[0] == seen[1] == _batches(prepare_data_loader(DataLoader(list(range(12)), batch_size=2),
                                                              num_processes=2, process_index=0))
    assert seen[2] == seen[3] == [[2, 3], [6, 7], [10, 11]]
    assert seen[0] == [[0, 1], [4, 5], [8, 9]]


def test_a_data_parallel_only_mesh_shards_as_without_a_mesh():
    mesh = Mesh(dp_replicate=2, dp_shard=2)
    for rank in range(4):
        plain = prepare_data_loader(DataLoader(list(range(12)), batch_size=2), num_processes=4, process_index=rank)
        assert _batches(_prepared(mesh, rank)) == _batches(plain)


def test_a_tensor_parallel_only_mesh_gives_every_rank_the_whole_loader():
    assert [_batches(_prepared(Mesh(tp=4), rank, n=6)) for rank in range(4)] == [[[0, 1], [2, 3], [4, 5]]] * 4


def test_the_refusal_is_gone_and_bad_meshes_say_what_to_do():
    with pytest.raises(ValueError, match="rename them"):
        _prepared(Mesh(dp_shard=2, sp=2), 3)


# -- the dispatcher and a mesh -------------------------------------------------------------------------------------
DISPATCH = dict(dispatch_batches=True, put_on_device=True, device=torch.device("cpu"))


def test_dispatching_on_a_tensor_parallel_mesh_gives_every_process_the_same_whole_batch():
    for rank in (0, 3):
        loader = _prepared(Mesh(tp=4), rank, n=7, **DISPATCH)
        assert isinstance(loader, DispatchedDataLoader) and loader.same_batch_everywhere
        assert _batches(loader) == [[0, 1], [2, 3], [4, 5], [6]]
        assert len(loader) == 4  # the batches it yields (Accelerate's says ceil(4 / 4) = 1)
        assert loader.remainder == 4  # Accelerate's: the last batch repeated once per process
    assert loader.total_batch_size == 2


def test_a_view_of_such_a_loader_keeps_giving_the_whole_batch():
    from hasten.data import skip_first_batches

    loader = _prepared(Mesh(tp=4), 2, n=7, **DISPATCH)
    assert _batches(skip_first_batches(loader, 2)) == [[4, 5], [6]]


def test_dispatching_with_split_batches_on_a_tensor_parallel_mesh_cuts_over_every_process_and_warns():
    with pytest.warns(UserWarning, match="split_batches=True on a mesh with 'tp'"):
        loader = _prepared(Mesh(tp=4), 1, n=8, batch_size=4, split_batches=True, **DISPATCH)
    assert _batches(loader) == [[1], [5]]


def test_dispatching_across_data_parallel_dims_warns_that_they_get_the_same_batches():
    with pytest.warns(UserWarning, match="also across dp_replicate / dp_shard"):
        loader = _prepared(Mesh(dp_shard=2, tp=2), 3, n=4, **DISPATCH)
    assert _batches(loader) == [[0, 1], [2, 3]]


def test_dispatching_with_tp_beside_a_dp_dim_is_refused_as_in_accelerate():
    with pytest.raises(ValueError, match="use dispatch_batches=False"):
        _prepared(Mesh(dp=2, tp=2), 0, **DISPATCH)
    with pytest.raises(ValueError, match="beside a 'dp' or 'fsdp' dim"):
        dispatch_layout(Mesh(fsdp=2, tp=2), split_batches=False)


def test_without_tp_the_dispatcher_ignores_the_mesh():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = _prepared(Mesh(dp_replicate=2, cp=2), 1, n=8, **DISPATCH)
    assert not loader.same_batch_everywhere and _batches(loader) == [[2, 3]]


# -- 4 real processes, against Accelerate ----------------------------------------------------------------------------
SCRIPT = Path(__file__).parent / "scripts" / "mesh_loader.py"
# Accelerate's dispatcher on a tp mesh yields every batch but says len = ceil(batches / processes); hasten's says
# how many it yields
DISPATCHED_ON_TP = {"dpxtp", "dp_shardxtp", "tp"}


def _peer_run(out: Path) -> None:
    from conftest import run_with_timeout

    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", "--num_processes", "4", str(SCRIPT), "accelerate",
               str(out)]
    result = run_with_timeout(command, 240, leftovers_fail=False)
    assert result.returncode == 0, f"Accelerate's run failed:\n{result.stdout}\n{result.stderr[-4000:]}"


@pytest.mark.multiprocess
@pytest.mark.parity
@pytest.mark.timeout(600)
def test_four_processes_read_what_accelerate_gives_each_rank_on_the_same_mesh(tmp_path):
    from conftest import launch

    if importlib.util.find_spec("accelerate") is None:
        pytest.skip("Accelerate is not installed (pip install accelerate==1.16.0): it is the reference here")
    launch(SCRIPT, "hasten", str(tmp_path), num_processes=4, timeout=240)
    _peer_run(tmp_path)
    for rank in range(4):
        ours = json.loads((tmp_path / f"hasten_rank{rank}.json").read_text())
        theirs = json.loads((tmp_path / f"accelerate_rank{rank}.json").read_text())
        assert ours.keys() == theirs.keys()
        assert "TP + (DP/FSDP)" in theirs["dpxtp:dispatch"]["message"]  # the reference is Accelerate's own code
        for key, reference in theirs.items():
            mine = ours[key]
            mesh, case = key.split(":")
            if "error" in reference or (mesh == "dp_shardxsp" and not case.startswith(("dispatch", "stream"))):
                # Accelerate's own refusals are kept; a mesh with a dim it neither shards over nor keeps together
                # (sp) makes its ranks 2 and 3 fail inside its sampler: hasten refuses it on every rank
                assert mine.get("error") == "ValueError", (rank, key, mine, reference)
                continue
            assert mine.get("batches") == reference["batches"], (rank, key, mine, reference)
            if case == "dispatch" and mesh in DISPATCHED_ON_TP:
                assert mine["len"] == len(mine["batches"]), (rank, key)
            else:
                assert mine["len"] == reference["len"], (rank, key, mine, reference)
        # the facts the comparison rests on: Accelerate reads only dp_replicate/dp_shard as data parallel
        expected = ([[0, 1], [4, 5], [8, 9], [12, 13], [16, 17], [20, 21]] if rank < 2
                    else [[2, 3], [6, 7], [10, 11], [14, 15], [18, 19], [0, 1]])
        assert ours["dp_shardxtp:plain"]["batches"] == expected
        assert len(ours["dpxtp:plain"]["batches"]) == 11  # "dp" is not a name Accelerate shards over...
        assert any("['dp']" in w for w in ours["dpxtp:plain"]["warnings"])  # ...and hasten says so
    shuffled = [json.loads((tmp_path / f"hasten_rank{r}.json").read_text())["dp_shardxtp:shuffle"]["batches"]
                for r in range(4)]
    assert shuffled[0] == shuffled[1] and shuffled[2] == shuffled[3] and shuffled[0] != shuffled[2]
