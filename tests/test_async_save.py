"""save_state(async_save=True): returns once the state is copied, publishes in the background the same bytes a
synchronous save writes; the next save, and the end of the run, wait for it; its errors reach wait()."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from conftest import launch

from hasten import Accelerator
from hasten.runtime.gradient_state import GradientState
from hasten.checkpointing import background, snapshot
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


@pytest.fixture
def slow_copy(monkeypatch):
    """The writer thread starts copying the parameters 0.3 s late: whatever runs meanwhile would race it."""
    finish = snapshot.Snapshot.finish

    def late(self):
        time.sleep(0.3)
        finish(self)

    monkeypatch.setattr(snapshot.Snapshot, "finish", late)


def _large(accelerator):
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 4))  # 256 KiB: copied by the writer
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(4, 256)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


def test_an_optimizer_step_right_after_the_save_waits_for_the_copy(tmp_path, slow_copy):
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True)
    model, optimizer = _large(accelerator)
    accelerator.save_state(tmp_path / "sync")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    handle = accelerator.save_state(tmp_path / "async", async_save=True)
    assert background.pending() is handle  # still copying (0.3 s late) when the step below starts
    model(torch.randn(4, 256)).sum().backward()
    optimizer.step()  # waits for the copy, then changes the weights and AdamW's moments in place
    optimizer.zero_grad()
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())  # the step really changed them
    handle.wait()
    _same_checkpoint(tmp_path / "sync", tmp_path / "async")  # the pre-step weights and moments, bit for bit


def test_an_in_place_change_outside_the_optimizer_before_the_copy_fails_the_save(tmp_path, slow_copy):
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True)
    model, optimizer = _large(accelerator)
    handle = accelerator.save_state(tmp_path / "async", async_save=True)
    with torch.no_grad():
        model[0].weight.add_(1.0)  # not through the optimizer, and before the writer copied it
    with pytest.raises(CheckpointError, match="changed in place before it was copied"):
        handle.wait()
    assert not (tmp_path / "async").exists()  # a mixed state is never published
    optimizer.step()  # and nothing waits for that failed copy any more


def test_load_state_waits_for_the_pending_save(tmp_path, slow_copy):
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True)
    model, optimizer = _large(accelerator)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    accelerator.save_state(tmp_path / "async", async_save=True)
    assert not (tmp_path / "async").exists()  # not published yet (the copy starts 0.3 s late)
    accelerator.load_state(tmp_path / "async")  # waits for it (and only then writes into the live weights)
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())


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


def test_deepspeed_refuses_async_save_in_one_sentence_saying_why():
    from types import SimpleNamespace

    from hasten.strategies.deepspeed.strategy import DeepSpeedStrategy

    with pytest.raises(CheckpointError, match=r"not available under DeepSpeed, .*decoupled checkpoint engine.*; call "
                                              r"save_state without async_save") as refused:
        DeepSpeedStrategy.begin_checkpoint_files(SimpleNamespace(), Path("unused"), [], [])
    assert refused.value.args[0].count(". ") == 0  # one sentence


@pytest.mark.multiprocess
def test_async_save_on_two_processes_equals_sync_and_the_end_of_the_run_waits(tmp_path):
    launch("ckpt_async.py", str(tmp_path), "--end-right-after", timeout=180)
    for step in range(4):
        assert (tmp_path / "async" / f"step_{step}" / "hasten_checkpoint.json").exists(), f"step {step} not published"
        _same_checkpoint(tmp_path / "sync" / f"step_{step}", tmp_path / "async" / f"step_{step}")
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert all(report["is_str"] for report in reports)
    # the parameters and AdamW state are copied (and their buffers kept) by the process that writes them only
    # (deferred: storages of 64 KiB and more, here the first layer's weight and its two AdamW moments)
    assert reports[0]["copy_buffer_bytes"][1:] == [3 * 4 * 64 * 256] * 3, reports[0]
    assert reports[1]["copy_buffer_bytes"] == [0] * 4, reports[1]


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", ["sharded", "full"])
def test_fsdp2_async_save_writes_the_files_of_a_synchronous_save_and_loads_the_same_state(tmp_path, kind):
    from safetensors.torch import load_file
    from torch.distributed.checkpoint import FileSystemReader

    launch("fsdp_async.py", str(tmp_path), *(["--full"] if kind == "full" else []), timeout=240)
    sync, done = tmp_path / "sync", tmp_path / "async"
    files = sorted(str(p.relative_to(sync)) for p in sync.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(done)) for p in done.rglob("*") if p.is_file())
    if kind == "sharded":  # DCP's shards, written by DCP's async_save
        assert any(name.endswith(".distcp") for name in files) and any(name.startswith("optimizer_0/") for name in files)
    else:  # gathered on the main process at the call, written by the writer thread
        assert {"model.safetensors", "optimizer.bin"} <= set(files)
    for name in files:
        if name.endswith(".metadata"):  # DCP records the folder and a fresh save id: compare what it describes
            assert (FileSystemReader(sync / Path(name).parent).read_metadata().state_dict_metadata
                    == FileSystemReader(done / Path(name).parent).read_metadata().state_dict_metadata), name
        elif name != "hasten_checkpoint.json":
            assert (sync / name).read_bytes() == (done / name).read_bytes(), f"{name} differs"
    manifest = json.loads((done / "hasten_checkpoint.json").read_text())
    assert sorted(manifest["files"]) == sorted(n for n in files if n != "hasten_checkpoint.json")
    assert sorted(manifest["hashes"]["files"]) == sorted(manifest["files"])  # published through the same manifest, hashed
    states = {name: load_file(tmp_path / f"state.{name}.safetensors") for name in ("saved", "stepped", "async", "sync")}
    assert any(not torch.equal(states["saved"][k], v) for k, v in states["stepped"].items())  # the step changed them
    for name in ("async", "sync"):  # the step taken while the shards were written did not reach them
        assert states[name].keys() == states["saved"].keys()
        assert all(torch.equal(states["saved"][k], v) for k, v in states[name].items()), name
    for rank in (0, 1):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == {"is_str": True, "path": str(done)}


def test_the_writer_runs_below_the_trainings_priority_and_says_so_when_no_core_is_left(tmp_path, monkeypatch, capsys):
    # A save must never slow training down: its writer (and the hashing thread it starts) takes only the CPU that
    # training leaves. Where torch's threads fill every core, hasten says once how the save will progress.
    import os
    import sys
    import threading

    from hasten.checkpointing import background

    if not sys.platform.startswith("linux"):
        pytest.skip("per-thread priorities are Linux's")
    seen = {}

    def work():
        seen["writer"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        started = threading.Thread(target=lambda: seen.update(helper=os.getpriority(
            os.PRIO_PROCESS, threading.get_native_id())))
        started.start()
        started.join()

    monkeypatch.setattr(background, "_said", False)
    monkeypatch.setattr(background, "cores_left_for_the_writer", lambda: 0)
    handle = background.run_in_background(tmp_path / "ckpt", work)
    handle.wait()
    assert seen == {"writer": 19, "helper": 19}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == 0  # the training thread keeps its own
    assert capsys.readouterr().err.count("shares the CPUs with training") == 1
    background.run_in_background(tmp_path / "ckpt2", lambda: None).wait()
    assert "shares the CPUs" not in capsys.readouterr().err  # once
