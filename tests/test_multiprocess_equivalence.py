"""The core promise: 1 process with the global batch == N processes with the per-process batch.

Both runs start from the same seed, see the same global batches in the
same order, and (DDP averaging the per-rank mean losses) compute the same
gradients, so their final parameters must agree to float rounding.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from safetensors.torch import load_file

from conftest import SCRIPTS, launch, run_with_timeout

SCRIPT = "mp_train_equivalence.py"
TOLERANCE = 1e-6
# name -> (config for 1 process, config for 2 processes): name:batch:accumulation:split_batches:optimizer
CONFIGS = {
    "plain": ("plain:16:1:0:sgd", "plain:8:1:0:sgd"),
    "accum4": ("accum4:16:4:0:sgd", "accum4:8:4:0:sgd"),
    # 8 batches per epoch with 3 accumulation steps: the last sync comes from the end of the loader
    "accum3": ("accum3:16:3:0:sgd", "accum3:8:3:0:sgd"),
    "split": ("split:16:1:1:sgd", "split:16:1:1:sgd"),
    "adamw": ("adamw:16:1:0:adamw", "adamw:8:1:0:adamw"),
}


def run_plain_python(*args: str, timeout: float = 120) -> None:
    """`python script.py ...` without any launcher: the plain single-process path."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "HASTEN_LAUNCH_SPEC")}
    command = [sys.executable, str(SCRIPTS / SCRIPT), *args]
    result = run_with_timeout(command, timeout, env)
    if result.returncode != 0:
        pytest.fail(f"exited {result.returncode}: {' '.join(command)}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("equivalence")
    one, two = root / "one", root / "two"
    run_plain_python(str(one), *(c[0] for c in CONFIGS.values()))
    launch(SCRIPT, str(two), *(c[1] for c in CONFIGS.values()), num_processes=2)
    return one, two


def _load(path):
    return {k: v.double() for k, v in load_file(str(path)).items()}


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", list(CONFIGS))
def test_one_process_equals_two_processes(runs, name):
    one, two = runs
    final_one, final_two = _load(one / f"{name}.safetensors"), _load(two / f"{name}.safetensors")
    init_one, init_two = _load(one / f"{name}.init.safetensors"), _load(two / f"{name}.init.safetensors")

    # same starting point, and training really moved the parameters (so equality is not trivial)
    assert _max_diff(init_one, init_two) == 0.0
    assert _max_diff(final_one, init_one) > 0.05, "training barely changed the parameters: the comparison proves nothing"

    diff = _max_diff(final_one, final_two)
    assert diff <= TOLERANCE, f"{name}: 1-process and 2-process parameters differ by {diff:.3g}"

    # every rank iterated the same number of batches, all of them shards of the same epoch
    info_one = json.loads((one / f"{name}.rank0.json").read_text())
    infos_two = [json.loads((two / f"{name}.rank{r}.json").read_text()) for r in (0, 1)]
    assert info_one["loader_len"] == 8  # 128 samples / global batch 16
    for info in infos_two:
        assert info["loader_len"] == 8
        assert info["micro_batches"] == info_one["micro_batches"] == 8 * 3
        assert info["last_loss"] == pytest.approx(info_one["last_loss"], abs=1e-5)
    assert info_one["last_loss"] < info_one["first_loss"]


@pytest.mark.multiprocess
def test_accumulation_changes_the_result(runs):
    """Negative control: if accumulation were silently ignored, accum4 would equal plain."""
    _, two = runs
    plain, accum = _load(two / "plain.safetensors"), _load(two / "accum4.safetensors")
    assert _max_diff(plain, accum) > 1e-2
    accum3 = _load(two / "accum3.safetensors")
    assert _max_diff(accum, accum3) > 1e-3


@pytest.mark.multiprocess
def test_launch_with_one_process_equals_plain_python(runs, tmp_path):
    """`hasten launch --num_processes 1` runs the same single-process path as plain `python script.py`."""
    one, _ = runs
    launch(SCRIPT, str(tmp_path), CONFIGS["plain"][0], num_processes=1)
    diff = _max_diff(_load(one / "plain.safetensors"), _load(tmp_path / "plain.safetensors"))
    assert diff <= TOLERANCE
