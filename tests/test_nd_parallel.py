"""N-D parallelism through `Accelerator(parallelism_config=...)`: the dataclass against Accelerate's, then training.

Two launches (2 and 4 processes, `tests/scripts/nd_train.py`) run every layout
that fits them through the normal loop and compare each with one process
trained on the same global batches; the 4-process one also saves, loads into
a fresh Accelerator and continues (HSDP, FSDP x TP, TP).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from conftest import launch_ranks

from hasten.parallelism_config import ParallelismConfig

TOLERANCE = 1e-5
BATCH = 2  # per process, as in nd_train.py

LAYOUTS = {  # name -> (processes, sizes, distributed type, mesh dims, flattened views)
    "dp_shard=2": (2, {"dp_shard_size": 2}, "FSDP", ["dp_shard"], {"dp": 2, "dp_shard_cp": 2, "dp_cp": 2}),
    "dp_replicate=2": (2, {"dp_replicate_size": 2}, "MULTI_CPU", ["dp_replicate"], {"dp": 2, "dp_cp": 2}),
    "tp=2": (2, {"tp_size": 2}, "MULTI_CPU", ["tp"], {}),
    "dp_shard=4": (4, {"dp_shard_size": 4}, "FSDP", ["dp_shard"], {"dp": 4, "dp_shard_cp": 4, "dp_cp": 4}),
    "dp_replicate=4": (4, {"dp_replicate_size": 4}, "MULTI_CPU", ["dp_replicate"], {"dp": 4, "dp_cp": 4}),
    "hsdp=2x2": (4, {"dp_replicate_size": 2, "dp_shard_size": 2}, "FSDP", ["dp_replicate", "dp_shard"],
                 {"dp": 4, "dp_shard_cp": 2, "dp_cp": 4}),
    "dp_shard=2,tp=2": (4, {"dp_shard_size": 2, "tp_size": 2}, "FSDP", ["dp_shard", "tp"],
                        {"dp": 2, "dp_shard_cp": 2, "dp_cp": 2}),
    "tp=4": (4, {"tp_size": 4}, "MULTI_CPU", ["tp"], {}),
    # Accelerate 1.16 allows tensor parallel beside plain replication (1.15 refused it, 1.16 runs it as a plain
    # multi-device run): hasten shards over the replicas with FSDP2, which keeps them in step, and says FSDP
    "dp_replicate=2,tp=2": (4, {"dp_replicate_size": 2, "tp_size": 2}, "FSDP", ["dp_replicate", "tp"],
                            {"dp": 2, "dp_cp": 2}),
    # a model split already (DTensor parameters, as transformers' tp_plan="auto" leaves it) is only sharded
    "split before prepare": (4, {"dp_shard_size": 2, "tp_size": 2}, "FSDP", ["dp_shard", "tp"],
                             {"dp": 2, "dp_shard_cp": 2, "dp_cp": 2}),
}


# -- the dataclass -------------------------------------------------------------------
def test_fields_and_defaults_match_accelerate():
    accelerate_pc = pytest.importorskip("accelerate.parallelism_config")
    theirs, ours = accelerate_pc.ParallelismConfig(), ParallelismConfig()
    names = [f.name for f in dataclasses.fields(accelerate_pc.ParallelismConfig)]
    assert [f.name for f in dataclasses.fields(ParallelismConfig) if f.init] == names  # same order: positional calls
    for name in names:
        assert getattr(ours, name) == getattr(theirs, name), name
    assert (ours.total_size, ours.dp_dim_names, ours.non_dp_dim_names) == (1, [], [])
    tp = ParallelismConfig(dp_shard_size=2, tp_size=2)
    assert type(tp.tp_handler).__name__ == "TorchTensorParallelConfig"  # Accelerate's default handler
    assert tp.fsdp_dim_names == ["dp_shard_cp"] and tp.non_data_parallel_size == 2


def test_sizes_from_accelerates_launcher_variables(monkeypatch):
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "2")
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "2")
    config = ParallelismConfig()
    assert (config.dp_shard_size, config.tp_size, config.total_size) == (2, 2, 4)
    assert ParallelismConfig(tp_size=1).tp_size == 1  # a given size wins


@pytest.mark.parametrize("kwargs, words", [
    ({"sp_backend": "other"}, "sp_backend must be 'deepspeed'"),
    ({"cp_backend": "other"}, "cp_backend must be 'torch'"),
])
def test_what_hasten_cannot_honour_is_refused(kwargs, words):
    with pytest.raises(ValueError, match=words):
        ParallelismConfig(**kwargs)


def test_settle_is_accelerates_validation():
    config = ParallelismConfig()
    config.settle(4)  # all sizes 1 on 4 processes: plain DDP over the 4
    assert config.dp_replicate_size == 4 and config.total_size == 4
    with pytest.raises(ValueError, match="needs 2 processes"):
        ParallelismConfig(tp_size=2).settle(4)
    with pytest.raises(ValueError, match="no dim to shard over"):
        ParallelismConfig(tp_size=4).settle(4, fsdp_plugin_given=True)


def test_sizes_beyond_the_processes_started_are_refused_by_count_not_by_a_missing_process_group():
    from hasten import Accelerator
    from hasten.state import AcceleratorState

    AcceleratorState._reset_state(True)
    with pytest.raises(ValueError, match="needs 2 processes .* but 1 were started"):
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(tp_size=2))
    AcceleratorState._reset_state(True)


def test_the_older_tp_plugin_and_model_tp_size_as_accelerate():
    accelerate_utils = pytest.importorskip("accelerate.utils")
    from hasten import Accelerator
    from hasten.utils import TorchTensorParallelPlugin, get_model_tp_size

    fields = [(f.name, f.default) for f in dataclasses.fields(TorchTensorParallelPlugin)]
    assert fields == [(f.name, f.default) for f in dataclasses.fields(accelerate_utils.TorchTensorParallelPlugin)]

    class Model:  # what transformers records: on the model (< 5) or in config.distributed_config (>= 5)
        def __init__(self, tp_size=None, config=None):
            self.tp_size, self.config = tp_size, config

    class Config:
        def __init__(self, distributed_config):
            self.distributed_config = distributed_config

    class Distributed:
        tp_size = 4

    for model in (Model(), Model(2), Model(None, Config({"tp_size": 2})), Model(None, Config(Distributed())),
                  Model(None, Config(None)), object()):
        assert get_model_tp_size(model) == accelerate_utils.get_model_tp_size(model)
    with pytest.warns(FutureWarning, match="TorchTensorParallelPlugin is deprecated"):
        accelerator = Accelerator(cpu=True, torch_tp_plugin=TorchTensorParallelPlugin(tp_size=1))
    assert accelerator.parallelism_config.tp_size == 1  # Accelerate: ParallelismConfig(tp_size=plugin.tp_size)
    assert accelerator.state.torch_tp_plugin is None  # Accelerate's Accelerator does not hand it to its state


# -- training on real processes --------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {n: launch_ranks("nd_train.py", tmp_path_factory.mktemp(f"nd{n}"), num_processes=n) for n in (2, 4)}


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_trains_like_one_process(runs, name):
    processes, sizes, distributed_type, dims, flat = LAYOUTS[name]
    results = {rank: result["layouts"][name] for rank, result in runs[processes].items()}
    config = ParallelismConfig(**sizes)
    repeats, dp = config.non_data_parallel_size, config.data_parallel_size
    for rank, result in results.items():
        assert result["diff"] <= TOLERANCE, f"{name} rank {rank}: parameters differ by {result['diff']}"
        assert (result["distributed_type"], result["dims"], result["flat"]) == (distributed_type, dims, flat)
        assert result["gathered"] == list(range(10))  # every evaluation sample once, none repeated
        assert result["objects"] == [f"s{i}" for i in range(10)]
        if config.tp_enabled:
            assert result["tp_rank"] == rank % config.tp_size
            assert result["dtensors"] >= 8  # the planned linears were split
        # one tp group reads one batch (Accelerate's rank // (tp * cp)); together the groups read the global batch
        assert result["seen"] == results[rank - rank % repeats]["seen"]
    for step in range(len(results[0]["seen"])):
        rows = sorted(i for rank in range(0, processes, repeats) for i in results[rank]["seen"][step])
        assert rows == list(range(step * dp * BATCH, (step + 1) * dp * BATCH))
    assert math.prod(sizes.values()) == processes


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["hsdp=2x2", "dp_shard=2,tp=2", "tp=4"])
def test_resumed_run_equals_uninterrupted(runs, name):
    for rank, result in runs[4].items():
        resumed = result["resumed"][name]
        assert resumed["diff"] <= TOLERANCE, f"{name} rank {rank}: resumed parameters differ by {resumed['diff']}"
        assert resumed["seen"] == result["layouts"][name]["seen"][2:4]  # it went on with steps 3 and 4


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_model_split_over_another_tp_size_is_refused(runs):
    for result in runs[4].values():  # split over 2 processes, prepared under tp_size=4 (Accelerate raises too)
        assert result["refused_split"] == (
            "ConfigError: the model was split for tensor parallelism over 2 processes before prepare, but the "
            "ParallelismConfig has tp_size=4; split it with tp_size=4 (e.g. from_pretrained(..., tp_plan='auto', "
            "tp_size=4)) or set ParallelismConfig(tp_size=2).")
