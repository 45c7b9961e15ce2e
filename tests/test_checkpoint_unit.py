"""The checkpoint layer in one process: what is saved and restored, bad input, nothing half-changed."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, DataLoaderConfiguration
from hasten.checkpointing import CheckpointError, ProjectConfiguration
from hasten.utils import load, load_checkpoint_in_model


class Counter:
    def __init__(self):
        self.steps = 0

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = state["steps"]


def make_run(project: Path | None = None, stateful: bool = True, total_limit: int | None = None, **kwargs):
    torch.manual_seed(0)
    config = None
    if project is not None:
        config = ProjectConfiguration(project, automatic_checkpoint_naming=True, total_limit=total_limit)
    accelerator = Accelerator(cpu=True, project_config=config,
                              dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=stateful), **kwargs)
    model = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.2), nn.Linear(4, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.5)
    data = TensorDataset(torch.randn(24, 3), torch.randn(24, 1))
    loader = DataLoader(data, batch_size=4, shuffle=True)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    return accelerator, model, optimizer, loader, scheduler, counter


def forever(loader):
    while True:
        yield from loader


def train(accelerator, model, optimizer, loader, scheduler, counter, batches, stream=None):
    """Train `batches` batches from `stream` (a loop that stays inside the loader, as a real one does)."""
    seen = []
    stream = stream or forever(loader)
    for _ in range(batches):
        x, y = next(stream)
        with accelerator.accumulate(model):
            loss = (model(x) - y).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step(); scheduler.step(); optimizer.zero_grad()
        counter.steps += 1
        seen.append(loss.item())
    return seen


def snapshot(accelerator, model, optimizer, loader, scheduler, counter):
    return {
        "params": {k: v.clone() for k, v in model.state_dict().items()},
        "optimizer": json.dumps(str(optimizer.state_dict())),
        "lr": scheduler.get_last_lr(),
        "cursor": (loader.cursor.epoch, loader.cursor.yielded, loader.cursor.pending_skip),
        "counter": counter.steps,
        "rng": (torch.get_rng_state().clone(), random.getstate(), np.random.get_state()[1].copy()),
    }


def assert_same(a, b):
    assert a["params"].keys() == b["params"].keys()
    assert all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"])
    assert (a["optimizer"], a["lr"], a["cursor"], a["counter"]) == (b["optimizer"], b["lr"], b["cursor"], b["counter"])
    assert torch.equal(a["rng"][0], b["rng"][0]) and a["rng"][1] == b["rng"][1] and (a["rng"][2] == b["rng"][2]).all()


def test_round_trip_continues_exactly(tmp_path):
    run = make_run(tmp_path / "project")
    stream = forever(run[3])
    train(*run, batches=4, stream=stream)
    path = run[0].save_state()
    assert path.endswith("checkpoints/checkpoint_0")
    expected = train(*run, batches=5, stream=stream)  # crosses the epoch's end (6 batches per epoch)

    fresh = make_run(tmp_path / "project")
    assert fresh[0].load_state() == path
    assert fresh[5].steps == 4 and fresh[3].cursor.pending_skip == 4
    assert train(*fresh, batches=5) == expected
    assert fresh[0].save_iteration == 1  # the next automatic checkpoint does not overwrite the loaded one


def test_files_have_accelerates_names_and_a_manifest(tmp_path):
    run = make_run()
    train(*run, batches=1)
    run[0].save_state(tmp_path / "ckpt")
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    # Accelerate 1.16 writes exactly these for these objects (dl_state_dict.bin: the torchdata state of a loader
    # prepared with use_stateful_dataloader=True; hasten resumes from the position in its manifest);
    # test_checkpoint_accelerate.py compares against Accelerate itself.
    assert names == ["custom_checkpoint_0.pkl", "dl_state_dict.bin", "hasten_checkpoint.json", "model.safetensors",
                     "optimizer.bin", "random_states_0.pkl", "scheduler.bin"]
    manifest = json.loads((tmp_path / "ckpt" / "hasten_checkpoint.json").read_text())
    assert manifest["files"]["model.safetensors"] == (tmp_path / "ckpt" / "model.safetensors").stat().st_size
    assert manifest["dataloaders"][0]["epoch"] == 0 and manifest["saved_by"] == [0]


def test_load_state_without_checkpoint_yet_is_a_no_op(tmp_path, capsys):
    run = make_run(tmp_path / "project")
    before = snapshot(*run)
    assert run[0].load_state() is None
    assert "no checkpoint yet" in capsys.readouterr().out
    assert_same(before, snapshot(*run))


def test_save_state_needs_a_directory_or_automatic_naming(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = make_run()
    with pytest.raises(ValueError, match=r"save_state\(\) needs a directory: pass save_state\(output_dir\)"):
        run[0].save_state()
    with pytest.raises(ValueError, match=r"load_state\(\) needs a directory"):
        run[0].load_state()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("damage, message", [
    ("missing", "the directory does not exist"),
    ("partial", "was interrupted before it completed"),
    ("foreign", "is not a complete hasten checkpoint: it has no hasten_checkpoint.json, which save_state writes "
                "last, and none of the files of an Accelerate checkpoint"),
    ("truncated", "is damaged: model.safetensors has"),
    ("deleted", "is damaged: optimizer.bin is missing"),
    ("bad json", "cannot be read"),
])
def test_bad_checkpoints_are_refused_and_nothing_changes(tmp_path, damage, message):
    run = make_run()
    train(*run, batches=2)
    ckpt = tmp_path / "ckpt"
    run[0].save_state(ckpt)
    if damage == "missing":
        ckpt = tmp_path / "nope"
    elif damage == "partial":  # killed before the rename: only the staging directory exists
        ckpt.rename(tmp_path / ".ckpt.staging")
    elif damage == "foreign":
        ckpt = tmp_path / "foreign"
        ckpt.mkdir()
        (ckpt / "notes.txt").write_text("hi")
    elif damage == "truncated":
        data = (ckpt / "model.safetensors").read_bytes()
        (ckpt / "model.safetensors").write_bytes(data[:-10])
    elif damage == "deleted":
        (ckpt / "optimizer.bin").unlink()
    else:
        (ckpt / "hasten_checkpoint.json").write_text("{not json")
    train(*run, batches=1)
    before = snapshot(*run)
    with pytest.raises(CheckpointError, match=message):
        run[0].load_state(ckpt)
    assert_same(before, snapshot(*run))


def test_a_checkpoint_of_another_model_is_refused_before_anything_changes(tmp_path):
    run = make_run()
    train(*run, batches=2)
    run[0].save_state(tmp_path / "mine")
    small = Accelerator(cpu=True)
    model = small.prepare(nn.Sequential(nn.Linear(3, 5), nn.Dropout(0.2), nn.Linear(5, 1)))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match="holds 1 optimizers but this run prepared 0"):
        small.load_state(tmp_path / "mine")
    run2 = make_run()
    run2[0]._models[0] = model  # same counts, different shapes
    run2[0]._seen.clear()
    with pytest.raises(CheckpointError, match=r"does not fit the model: 0\.(weight|bias) has shape \(4"):
        run2[0].load_state(tmp_path / "mine")
    assert all(torch.equal(before[k], model.state_dict()[k]) for k in before)


def test_total_limit_keeps_the_newest_and_never_deletes_first(tmp_path):
    run = make_run(tmp_path / "project", total_limit=1)
    for _ in range(3):
        train(*run, batches=1)
        run[0].save_state()
    names = [p.name for p in (tmp_path / "project" / "checkpoints").iterdir()]
    assert names == ["checkpoint_2"]
    with pytest.raises(ValueError, match="total_limit must be an integer >= 1"):
        ProjectConfiguration(tmp_path, total_limit=0)


def test_automatic_checkpoint_that_exists_is_not_overwritten(tmp_path):
    run = make_run(tmp_path / "project")
    run[0].save_state()
    run[0].project_configuration.iteration = 0
    with pytest.raises(CheckpointError, match="checkpoint_0 already exists"):
        run[0].save_state()


def test_saving_over_foreign_files_is_refused(tmp_path):
    run = make_run()
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match=r"already holds files that are not a hasten checkpoint \(notes.txt\)"):
        run[0].save_state(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "keep me"
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_register_for_checkpointing_needs_state_dict():
    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match=r"Item at index 1 \(object\) lack them"):
        accelerator.register_for_checkpointing(Counter(), object())
    assert accelerator._custom_objects == []


class Evil:
    ran = False

    def __reduce__(self):
        return (Evil._boom, ())

    @staticmethod
    def _boom():
        Evil.ran = True
        return "pwned"


class HoldsObject(Counter):
    def state_dict(self):
        return {"payload": Evil()}


def test_nothing_is_unpickled_from_a_checkpoint(tmp_path):
    accelerator = Accelerator(cpu=True)
    accelerator.register_for_checkpointing(HoldsObject())
    accelerator.save_state(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="holds Python objects that hasten does not unpickle"):
        accelerator.load_state(tmp_path / "ckpt")
    assert not Evil.ran


def test_hooks_take_over_models(tmp_path):
    run = make_run()
    accelerator = run[0]
    calls = []

    def save_hook(models, weights, output_dir):
        calls.append(("save", len(models), Path(output_dir).name))
        torch.save(weights.pop(), Path(output_dir) / "my_model.pt")

    def load_hook(models, input_dir):
        calls.append(("load", len(models), Path(input_dir).name))
        models.pop().load_state_dict(torch.load(Path(input_dir) / "my_model.pt", weights_only=True))

    handles = [accelerator.register_save_state_pre_hook(save_hook), accelerator.register_load_state_pre_hook(load_hook)]
    accelerator.save_state(tmp_path / "ckpt")
    assert not (tmp_path / "ckpt" / "model.safetensors").exists() and (tmp_path / "ckpt" / "my_model.pt").exists()
    accelerator.load_state(tmp_path / "ckpt")
    assert calls == [("save", 1, ".ckpt.staging"), ("load", 1, "ckpt")]
    for handle in handles:
        handle.remove()
    accelerator.save_state(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").exists() and not (tmp_path / "ckpt" / "my_model.pt").exists()


def test_save_model_shards_and_loads_back(tmp_path):
    accelerator = Accelerator(cpu=True)
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 8))
    accelerator.save_model(model, tmp_path, max_shard_size="17KB")
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                     "model-00003-of-00003.safetensors", "model.safetensors.index.json"]
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(model.state_dict())
    copy = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 8))
    load_checkpoint_in_model(copy, tmp_path, strict=True)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), copy.state_dict().values()))
    accelerator.save_model(model, tmp_path)  # one shard now: the old shards and index go
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]
    assert torch.equal(load(tmp_path / "model.safetensors")["2.bias"], model[2].bias)
    with pytest.raises(ValueError, match="max_shard_size='ten' is not a size"):
        accelerator.save_model(model, tmp_path, max_shard_size="ten")


def test_get_state_dict_is_the_users_module(tmp_path):
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(nn.Linear(2, 3))
    assert sorted(accelerator.get_state_dict(model)) == ["bias", "weight"]


def test_utils_load_refuses_pickles_by_default(tmp_path):
    torch.save({"x": Evil()}, tmp_path / "x.pt")
    with pytest.raises(Exception, match="Weights only load failed"):
        load(tmp_path / "x.pt")
    assert not Evil.ran


def test_loader_position_converts_between_global_batch_sizes():
    run = make_run()
    loader = run[3]
    state = {"epoch": 1, "yielded": 3, "global_batch_size": 8}
    assert loader.batches_to_skip(state) == 6  # 24 samples done / 4 per batch now
    with pytest.raises(ValueError, match="not a whole number of this run's global batches of 4"):
        loader.batches_to_skip({"epoch": 1, "yielded": 3, "global_batch_size": 6})
    assert loader.batches_to_skip({"epoch": 1, "yielded": 0, "global_batch_size": 6}) == 0
