"""use_stateful_dataloader=True where torchdata is not installed: hasten's checkpoints still resume exactly.

Accelerate refuses such a run; hasten says once that its loaders are not torchdata `StatefulDataLoader`s and keeps
each loader's position itself (as it did before it built on torchdata), so a mid-epoch checkpoint resumes at the
next batch.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch.utils.data import DataLoader

from hasten import Accelerator, DataLoaderConfiguration
from hasten.data import stateful


@pytest.fixture
def no_torchdata(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.split(".")[0] == "torchdata" else real(name, *a))
    monkeypatch.setattr(stateful, "_said", False)


def test_a_stateful_run_without_torchdata_says_so_once_and_resumes_at_the_next_batch(no_torchdata, tmp_path, capsys):
    def prepared():
        accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
        torch.manual_seed(0)
        loader = DataLoader(list(range(20)), batch_size=2, shuffle=True)
        return accelerator, accelerator.prepare(loader)

    accelerator, loader = prepared()
    assert capsys.readouterr().err.count("not torchdata StatefulDataLoaders") == 1
    assert not any(cls.__name__ == "StatefulDataLoader" for cls in type(loader).__mro__)
    seen = []
    for batch in loader:
        seen.append(batch.tolist())
        if len(seen) == 4:
            accelerator.save_state(str(tmp_path / "ckpt"))
        if len(seen) == 6:
            break
    accelerator, loader = prepared()
    assert "StatefulDataLoaders" not in capsys.readouterr().err  # said once per process
    accelerator.load_state(str(tmp_path / "ckpt"))
    resumed = [batch.tolist() for batch in loader]
    # the rest of the interrupted pass: the two batches the first run saw after its checkpoint, then four more
    assert resumed[:2] == seen[4:6] and len(resumed) == 10 - 4
    assert sorted(sum(seen[:4] + resumed, [])) == list(range(20))  # every sample once in the epoch
