"""Disk-bound tensors are copied on threads while the load goes on: same files, failures named, nothing left writing."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

from hasten.big_modeling import offload as offload_module
from hasten.big_modeling.copies import ParallelCopies
from hasten.big_modeling.loading import load_checkpoint_in_model
from hasten.checkpointing.model_files import write_model_files
from test_big_model_maps import DISK_MAP, Toy, toy


def _copy_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("hasten-offload-copy")]


def test_copies_run_on_two_threads_and_the_index_keeps_the_checkpoint_order(tmp_path, monkeypatch):
    original = toy(seed=5)
    write_model_files(original.state_dict(), tmp_path / "ckpt")
    seen: set[str] = set()
    real = offload_module._copy_range

    def slow(*args):  # long enough for the loader to hand out the next copy meanwhile
        seen.add(threading.current_thread().name)
        time.sleep(0.05)
        real(*args)

    monkeypatch.setattr(offload_module, "_copy_range", slow)
    with torch.device("meta"):
        model = Toy()
    load_checkpoint_in_model(model, tmp_path / "ckpt", device_map=DISK_MAP, offload_folder=tmp_path / "off", strict=True)
    assert len(seen) == 2 and all(name.startswith("hasten-offload-copy") for name in seen)
    assert not _copy_threads()  # the pool is gone once the load returns
    index = json.loads((tmp_path / "off" / "index.json").read_text())
    header = (tmp_path / "ckpt" / "model.safetensors").read_bytes()
    entries = json.loads(header[8:8 + int.from_bytes(header[:8], "little")])
    in_file = sorted((entry["data_offsets"][0], name) for name, entry in entries.items() if name != "__metadata__")
    assert list(index) == [name for _, name in in_file if name in index]  # the file's order, whichever copy ended first
    assert len(index) == 10
    for name in index:
        assert (tmp_path / "off" / f"{name}.dat").read_bytes() == original.state_dict()[name].numpy().tobytes()


def test_a_copy_that_fails_names_the_file_and_leaves_no_copy_running(tmp_path, monkeypatch):
    write_model_files(toy().state_dict(), tmp_path / "ckpt")
    real = offload_module._copy_range
    calls = []

    def cut_short(reader, offset, nbytes, writer):  # the file shrank after its header was read
        calls.append(offset)
        if len(calls) == 2:
            raise EOFError("the file ends 8 bytes before the tensor at offset 0 does")
        time.sleep(0.05)
        real(reader, offset, nbytes, writer)

    monkeypatch.setattr(offload_module, "_copy_range", cut_short)
    with torch.device("meta"):
        model = Toy()
    with pytest.raises(ValueError, match=r"model.safetensors is damaged or truncated \(the file ends 8 bytes"):
        load_checkpoint_in_model(model, tmp_path / "ckpt", device_map=DISK_MAP, offload_folder=tmp_path / "off")
    assert not _copy_threads()
    assert not (tmp_path / "off" / "index.json").exists()  # no index naming files that were never written


def test_a_finished_failure_is_raised_by_the_next_submit_after_the_copies_in_flight():
    copies, ended, release = ParallelCopies(), [], threading.Event()

    def slow() -> None:
        release.wait(5)
        ended.append("slow")

    def fail() -> None:
        raise OSError(28, "No space left on device")

    copies.submit(slow)
    copies.submit(fail)
    time.sleep(0.05)
    threading.Timer(0.1, release.set).start()
    with pytest.raises(OSError, match="No space left"):
        copies.submit(ended.append, "never")
    assert ended == ["slow"]  # the copy in flight ended before the error reached the caller
    assert not _copy_threads()
