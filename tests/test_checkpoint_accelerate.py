"""Checkpoints between Accelerate 1.16 and hasten: the same folder layout, and a run can switch libraries mid-way.

`scripts/ckpt_cross.py` is one training script whose only difference between the libraries is its import
line. It trains 5 steps and saves under one library, then loads and trains 5 more under either. Accelerate
(a test-only dependency; hasten never imports it) runs in a subprocess.

Where the math allows it is bit for bit: the continuation hasten trains from Accelerate's checkpoint has the
losses and learning rates of Accelerate's own continuation (float.hex), on 1 and 2 processes — weights,
AdamW's state, the scheduler, the registered counter, each rank's RNG (dropout) all come back. The data order
is not part of this test (``shuffle=False``; both resume with ``skip_first_batches`` from the counter, as
Accelerate's scripts do); sample-order parity is tested in tests/parity.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from conftest import SCRIPTS, launch, run_with_timeout

SCRIPT = SCRIPTS / "ckpt_cross.py"
PEER_VENV = Path("/tmp/peer/bin/python")


def peer_python() -> str:
    """An interpreter that has Accelerate: this one (the test extra installs it), else the local peer venv."""
    if importlib.util.find_spec("accelerate") is not None:
        return sys.executable
    if PEER_VENV.exists():
        return str(PEER_VENV)
    pytest.skip("Accelerate is not installed (pip install accelerate==1.16.0) - needed to write its checkpoints")


def run(library: str, phase: str, out: Path, *flags: str, num_processes: int = 1) -> dict[int, dict]:
    """Run one phase of the script under `library`; the per-rank reports."""
    if library == "hasten":
        if num_processes == 1:
            result = run_with_timeout([sys.executable, str(SCRIPT), library, phase, str(out), *flags], 120)
        else:
            result = launch(SCRIPT, library, phase, str(out), *flags, num_processes=num_processes, check=False)
    else:
        python = peer_python()
        prefix = [python] if num_processes == 1 else [
            python, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_machines", "1", "--mixed_precision", "no",
            "--dynamo_backend", "no", "--num_processes", str(num_processes)]
        result = run_with_timeout([*prefix, str(SCRIPT), library, phase, str(out), *flags], 120, leftovers_fail=False)
    assert result.returncode == 0, f"{library} {phase} failed:\n{result.stdout}\n{result.stderr}"
    return {r: json.loads((out / f"{library}_{phase}_rank{r}.json").read_text()) for r in range(num_processes)}


@pytest.mark.parametrize("num_processes", [1, pytest.param(2, marks=pytest.mark.multiprocess)])
def test_hasten_continues_an_accelerate_checkpoint_as_accelerate_does(tmp_path, num_processes):
    run("accelerate", "train", tmp_path, num_processes=num_processes)
    assert not (tmp_path / "ckpt" / "hasten_checkpoint.json").exists()
    theirs = run("accelerate", "continue", tmp_path, num_processes=num_processes)
    ours = run("hasten", "continue", tmp_path, num_processes=num_processes)
    for rank in range(num_processes):
        assert ours[rank]["restored_steps"] == theirs[rank]["restored_steps"] == 5
        assert ours[rank]["losses"] == theirs[rank]["losses"], f"rank {rank}"
        assert ours[rank]["lr"] == theirs[rank]["lr"], f"rank {rank}"
    if num_processes == 2:  # each rank's own RNG file was used: the two ranks' dropout differs
        assert ours[0]["losses"] != ours[1]["losses"]


def test_a_pickled_object_is_refused_unless_trusted(tmp_path):
    run("accelerate", "train", tmp_path, "--box")
    refused = run("hasten", "continue", tmp_path, "--box")[0]
    assert refused["error"].startswith("CheckpointError: custom_checkpoint_0.pkl in ")
    assert "holds Python objects that hasten does not unpickle (it loads with weights_only=True)" in refused["error"]
    assert refused["error"].endswith("if you trust this checkpoint, pass "
                                     "load_state(..., load_kwargs={'weights_only': False}).")
    theirs = run("accelerate", "continue", tmp_path, "--box")[0]  # Accelerate unpickles registered objects itself
    trusted = run("hasten", "continue", tmp_path, "--box", "--trust")[0]
    assert trusted["restored_steps"] == 5 and trusted["losses"] == theirs["losses"]


@pytest.mark.parametrize("num_processes, flags", [
    (1, ()),
    (1, ("--layout",)),  # a save hook writes the model in a subfolder and pops it from the weights (diffusers)
    pytest.param(2, ("--layout",), marks=pytest.mark.multiprocess),
])
def test_save_state_writes_accelerates_layout(tmp_path, num_processes, flags):
    layouts = {}
    for library in ("accelerate", "hasten"):
        out = tmp_path / library
        out.mkdir()
        report = run(library, "train", out, *flags, num_processes=num_processes)[0]
        layouts[library] = (report["files"], report["sub_files"])
    files, sub_files = layouts["hasten"]
    assert "hasten_checkpoint.json" in files
    assert ([f for f in files if f != "hasten_checkpoint.json"], sub_files) == layouts["accelerate"]


def test_automatic_naming_resumes_from_accelerates_newest_checkpoint(tmp_path):
    run("accelerate", "train", tmp_path)
    checkpoints = tmp_path / "project" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (tmp_path / "ckpt").rename(checkpoints / "checkpoint_3")  # as Accelerate's automatic naming leaves them
    (checkpoints / "checkpoint_1").mkdir()
    (checkpoints / "checkpoint_1" / "random_states_0.pkl").write_bytes(b"older, never read")
    report = run("hasten", "continue", tmp_path, "--auto")[0]
    assert report["loaded"] == str(checkpoints / "checkpoint_3") and report["restored_steps"] == 5
    assert report["save_iteration"] == 4  # the next automatic save does not overwrite it


CROSS = SCRIPTS / "fsdp_files_cross.py"


def _cross(python: str, mode: str, library: str, out: Path) -> dict:
    result = run_with_timeout([python, str(CROSS), mode, library, str(out)], 120)
    assert result.returncode == 0, f"{library} {mode} failed:\n{result.stdout}\n{result.stderr}"
    return json.loads(result.stdout.strip().splitlines()[-1]) if mode == "load" else {}


def _saved_names(directory: Path) -> list[str]:
    from torch.distributed.checkpoint import FileSystemReader

    return sorted(FileSystemReader(str(directory)).read_metadata().state_dict_metadata)


@pytest.mark.parametrize("writer, reader", [("accelerate", "hasten"), ("hasten", "accelerate")])
def test_a_sharded_fsdp_checkpoint_loads_in_the_other_library(tmp_path, writer, reader):
    """Accelerate's DCP directories hold {"model": ...} / {"optimizer": ...}; hasten writes and reads the same."""
    peer = peer_python()
    _cross(peer if writer == "accelerate" else sys.executable, "save", writer, tmp_path / writer)
    loaded = _cross(peer if reader == "accelerate" else sys.executable, "load", reader, tmp_path / writer)
    assert loaded == {"weights": True, "moments": True, "steps": [1, 1, 1, 1]}
    _cross(peer if writer != "accelerate" else sys.executable, "save", reader, tmp_path / reader)
    for directory in ("pytorch_model_fsdp_0", "optimizer_0"):
        assert _saved_names(tmp_path / writer / directory) == _saved_names(tmp_path / reader / directory)
    assert _saved_names(tmp_path / writer / "pytorch_model_fsdp_0")[0] == "model.0.bias"


def test_a_sharded_fsdp_checkpoint_of_the_older_layout_still_loads(tmp_path):
    _cross(sys.executable, "save-unwrapped", "hasten", tmp_path)
    assert _saved_names(tmp_path / "pytorch_model_fsdp_0")[0] == "0.bias"
    assert _cross(sys.executable, "load", "hasten", tmp_path) == {"weights": True, "moments": True, "steps": [1, 1, 1, 1]}
