"""save_state(async_save=True): returns once the state is copied, publishes in the background the same bytes a
synchronous save writes; the next save, and the end of the run, wait for it; its errors reach wait()."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from conftest import launch

from hasten import Accelerator
from hasten.gradient_state import GradientState
from hasten.checkpointing import background
from hasten.checkpointing.commit import CheckpointError
from hasten.checkpointing.project import ProjectConfiguration


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _same_checkpoint(a: Path, b: Path) -> None:
    left, right = _files(a), _files(b)
    assert sorted(left) == sorted(right)
    for name in left:
        if name == "hasten_checkpoint.json":  # the manifest names no path: equal but for the time it was written
            mine, theirs = json.loads(left[name]), json.loads(right[name])
            mine.pop("saved_at", None), theirs.pop("saved_at", None)
            assert mine == theirs, name
        else:
            assert left[name] == right[name], f"{name} differs between {a} and {b}"


@pytest.fixture
def accelerator_and_model():
    GradientState._reset_state()  # an earlier test may have left the shared accumulation state mid-cycle
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(32, 32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def _step(model, optimizer) -> None:
    model(torch.randn(4, 32)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def test_async_save_writes_the_bytes_of_a_synchronous_save(tmp_path, accelerator_and_model):
    accelerator, model, optimizer = accelerator_and_model
    _step(model, optimizer)
    accelerator.save_state(tmp_path / "sync")
    handle = accelerator.save_state(tmp_path / "async", async_save=True)
    with torch.no_grad():  # the copy was taken: changing the live weights now does not change what is written
        for parameter in model.parameters():
            parameter.add_(1.0)
    assert isinstance(handle, str) and handle.wait() == str(tmp_path / "async") and handle.done()
    _same_checkpoint(tmp_path / "sync", tmp_path / "async")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    accelerator.load_state(tmp_path / "async")
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())  # really loaded the older state


def test_a_second_save_waits_for_the_first_and_automatic_names_count_on(tmp_path, accelerator_and_model):
    accelerator, model, optimizer = accelerator_and_model
    accelerator.project_configuration = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True,
                                                             total_limit=2)
    handles = []
    for _ in range(3):
        _step(model, optimizer)
        handles.append(accelerator.save_state(async_save=True))
        assert background.pending() in (None, handles[-1])  # never two in flight
    handles[-1].wait()
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["checkpoint_1", "checkpoint_2"]  # rotation after each complete one, as synchronously
    assert accelerator.project_configuration.iteration == 3


def test_an_async_save_error_is_raised_by_wait_and_nothing_is_published(tmp_path, accelerator_and_model):
    accelerator, model, optimizer = accelerator_and_model

    class Unpicklable:  # copied fine (a function is copied as itself), fails when written
        def state_dict(self):
            return {"callback": lambda: None}

        def load_state_dict(self, state):
            pass

    accelerator.register_for_checkpointing(Unpicklable())
    handle = accelerator.save_state(tmp_path / "bad", async_save=True)
    with pytest.raises(CheckpointError, match="could not write"):
        handle.wait()
    assert not (tmp_path / "bad").exists()
    assert not any(p.name.startswith(".bad") for p in tmp_path.iterdir())  # the staging folder went too


def test_a_state_that_cannot_be_copied_is_refused_at_once_and_nothing_is_left(tmp_path, accelerator_and_model):
    accelerator, model, optimizer = accelerator_and_model

    class Locked:
        def state_dict(self):
            return {"lock": __import__("threading").Lock()}

        def load_state_dict(self, state):
            pass

    accelerator.register_for_checkpointing(Locked())
    with pytest.raises(CheckpointError, match="could not copy the state"):
        accelerator.save_state(tmp_path / "bad", async_save=True)
    assert list(tmp_path.iterdir()) == []
    assert background.pending() is None


def test_sharded_engines_refuse_async_save_in_one_sentence():
    source = Path(background.__file__).with_name("save.py").read_text()
    assert "save_state(async_save=True) is not available under" in source


@pytest.mark.multiprocess
def test_async_save_on_two_processes_equals_sync_and_the_end_of_the_run_waits(tmp_path):
    launch("ckpt_async.py", str(tmp_path), "--end-right-after", timeout=180)
    for step in range(4):
        assert (tmp_path / "async" / f"step_{step}" / "hasten_checkpoint.json").exists(), f"step {step} not published"
        _same_checkpoint(tmp_path / "sync" / f"step_{step}", tmp_path / "async" / f"step_{step}")
    for rank in (0, 1):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["is_str"]
