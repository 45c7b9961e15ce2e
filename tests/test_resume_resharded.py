"""A mid-epoch checkpoint of 2 processes finishes the epoch on 1 or 3, every engine: DDP, FSDP2 (sharded and
full state dicts) and DeepSpeed ZeRO 1-3 (its partitions re-cut at load).

Three launches of `scripts/reshard_train.py` (2 processes save, then 1 and 3 resume; each process count keeps the
global batch of 6). After the load, the parameters and the optimizer's state, gathered whole, are bit for bit the
ones gathered right before the save; the samples trained before the save and after the load are the epoch's, each
once; the finished epoch is the uninterrupted run's (up to summation order). A position that is no whole number
of the new global batches, or partial gradients of an accumulation cycle, are refused in one sentence.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from conftest import launch

pytestmark = pytest.mark.multiprocess

SCRIPT = "reshard_train.py"
SAMPLES = 36
ENGINES = ["ddp", "ddpplain", "fsdp", "fsdpfull", "z2", "z3"]  # ddpplain: DataLoader(shuffle=True), no generator
RESUMED = {1: 6, 3: 2}  # processes -> batch per process (global batch 6, as the saving run's 2 x 3)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("deepspeed")
    out = tmp_path_factory.mktemp("reshard")
    launch(SCRIPT, str(out), *[f"{e}:save" for e in ENGINES], "ddpmid:save", "z1:save", num_processes=2, timeout=240)
    launch(SCRIPT, str(out), *[f"{e}:resume:6" for e in ENGINES], "z1:resume:6", "fsdp:refuse:5", "z3:refuse:5",
           "ddpmid:refuse:6", num_processes=1, timeout=180)
    launch(SCRIPT, str(out), *[f"{e}:resume:2" for e in ENGINES], num_processes=3, timeout=240)
    return out


def _seen(directory, tag):
    return [i for path in sorted(directory.glob(f"{tag}.rank*.json")) for i in json.loads(path.read_text())["seen"]]


@pytest.mark.parametrize(("engine", "processes"),
                         [(e, n) for e in ENGINES for n in sorted(RESUMED)] + [("z1", 1)])  # ZeRO-1 cuts as ZeRO-2
def test_resume_on_another_number_of_processes(runs, engine, processes):
    directory = runs / engine
    saved = load_file(str(directory / "save.state.safetensors"))
    loaded = load_file(str(directory / f"resume{processes}.state.safetensors"))
    assert saved.keys() == loaded.keys() and any(k.startswith("exp_avg.") for k in saved)
    changed = [k for k in saved if not torch.equal(saved[k], loaded[k])]
    assert not changed, f"{engine} on {processes}: not the saved values: {changed[:4]}"
    before, after = _seen(directory, "save"), _seen(directory, f"resume{processes}")
    assert len(before) == 12 and sorted(before + after) == list(range(SAMPLES))  # every sample of the epoch once
    uninterrupted = load_file(str(directory / "save.final.safetensors"))
    finished = load_file(str(directory / f"resume{processes}.final.safetensors"))
    params = [k for k in uninterrupted if k.startswith("param.")]
    assert max((uninterrupted[k] - finished[k]).abs().max().item() for k in params) < 1e-6


@pytest.mark.parametrize("engine", ["fsdp", "z3"])
def test_a_position_that_does_not_divide_is_refused_in_one_sentence(runs, engine):
    error = json.loads((runs / engine / "refuse1.rank0.json").read_text())["error"]
    assert error.startswith("CheckpointError: data loader 0: the checkpoint stopped 2 batches of 6 samples into "
                            "epoch 0, which is not a whole number of this run's global batches of 5;"), error
    assert error.count(". ") == 0 and error.endswith(".")


def test_partial_gradients_of_an_accumulation_cycle_are_refused_on_another_count(runs):
    error = json.loads((runs / "ddpmid" / "refuse1.rank0.json").read_text())["error"]
    assert "was saved by 2 processes in the middle of a gradient accumulation cycle" in error, error
    assert "resume it on 2 processes, or from a checkpoint saved right after an optimizer step." in error
