"""`hasten.checkpointing.save_accelerator_state` / `load_accelerator_state` against Accelerate's own, in this process.

The same arguments give the same files with the same contents, and each library's loader restores the
other's folder: weights, AdamW's state, the scheduler, the GradScaler, the RNG streams and the step.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from hasten.checkpointing import load_accelerator_state, save_accelerator_state

accelerate_checkpointing = pytest.importorskip("accelerate.checkpointing")


@pytest.fixture(autouse=True)
def accelerate_state():
    """Accelerate's functions log through its logger, which needs its state (one CPU process)."""
    from accelerate.state import PartialState

    PartialState(cpu=True)


def objects(seed: int = 0):
    """Two models (one with tied weights), an AdamW that stepped, a scheduler and a GradScaler."""
    torch.manual_seed(seed)
    first, second = torch.nn.Linear(4, 3), torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    second[1].weight = second[0].weight  # tied: safetensors keeps one name, hasten's loader must accept that
    optimizer = torch.optim.AdamW([*first.parameters(), *second.parameters()], lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    second(first(torch.randn(2, 4))).sum().backward()
    optimizer.step()
    scheduler.step()
    scaler = torch.amp.GradScaler("cpu", init_scale=128.0)
    return [first, second], optimizer, scheduler, scaler


def save_with(save, folder, safe: bool):
    models, optimizer, scheduler, scaler = objects()
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    save(str(folder), [m.state_dict() for m in models], [optimizer], [scheduler], [], 0, 7, scaler=scaler,
         safe_serialization=safe)
    return sorted(p.name for p in folder.iterdir())


def read(folder, name):
    if name.endswith(".safetensors"):
        return load_file(folder / name)
    return torch.load(folder / name, weights_only=False)


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and sorted(a, key=str) == sorted(b, key=str) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("safe", [True, False])
def test_the_same_files_as_accelerates(tmp_path, safe):
    ours, theirs = tmp_path / "hasten", tmp_path / "accelerate"
    theirs.mkdir()
    names = save_with(accelerate_checkpointing.save_accelerator_state, theirs, safe)
    assert save_with(save_accelerator_state, ours, safe) == names
    expected = (["model.safetensors", "model_1.safetensors"] if safe else ["pytorch_model.bin", "pytorch_model_1.bin"])
    assert names == sorted([*expected, "optimizer.bin", "random_states_0.pkl", "scaler.pt", "scheduler.bin"])
    for name in names:
        assert same(read(ours, name), read(theirs, name)), name  # tied weights too: stored once, under the first name
    if safe:
        assert sorted(read(ours, "model_1.safetensors")) == ["0.bias", "0.weight", "1.bias"]


@pytest.mark.parametrize("direction", ["hasten reads accelerate", "accelerate reads hasten"])
def test_each_loads_the_others_folder(tmp_path, direction):
    save, load = ((accelerate_checkpointing.save_accelerator_state, load_accelerator_state)
                  if direction == "hasten reads accelerate" else
                  (save_accelerator_state, accelerate_checkpointing.load_accelerator_state))
    save_with(save, tmp_path, safe=True)
    saved_models, saved_optimizer, saved_scheduler, saved_scaler = objects()
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    draws = (random.random(), np.random.rand(), torch.rand(1))
    models, optimizer, scheduler, _ = objects(seed=5)  # other weights, and AdamW / scheduler states of its own
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    assert load(str(tmp_path), models, [optimizer], [scheduler], [], 0, scaler=scaler) == {"step": 7}
    assert (random.random(), np.random.rand(), torch.rand(1)) == draws  # the RNG streams continue as saved
    for model, saved in zip(models, saved_models):
        assert same(model.state_dict(), saved.state_dict())
    assert models[1][1].weight is models[1][0].weight  # still tied after loading
    assert same(optimizer.state_dict(), saved_optimizer.state_dict())
    assert scheduler.state_dict() == saved_scheduler.state_dict() and scaler.get_scale() == 128.0


def test_a_bad_map_location_is_refused_as_accelerate_does(tmp_path):
    for load in (load_accelerator_state, accelerate_checkpointing.load_accelerator_state):
        with pytest.raises(TypeError, match="map.location"):
            load(str(tmp_path), [], [], [], [], 0, map_location="disk")


def tied():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    model[1].weight = model[0].weight  # as transformers ties lm_head to the embedding
    return model


def test_save_state_and_load_state_meet_accelerate_on_tied_weights(tmp_path):
    from hasten import Accelerator
    from hasten.state import AcceleratorState, GradientState

    # Shared state, as Accelerate's: an earlier test left inside `accumulate` would make this step a non-syncing one.
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = tied()
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.1))
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    # Accelerate's function's folder (tied weight once) loads with load_state: the missing name is its twin's
    (tmp_path / "theirs").mkdir()
    accelerate_checkpointing.save_accelerator_state(str(tmp_path / "theirs"), [model.state_dict()], [optimizer], [], [], 0, 0)
    with torch.no_grad():
        model[0].weight.zero_()
    accelerator.load_state(str(tmp_path / "theirs"))  # no manifest: read as a folder Accelerate wrote
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items()) and model[1].weight is model[0].weight
    assert int(optimizer.state_dict()["state"][0]["step"]) == 1
    # save_state writes the tied weight once too, so Accelerate's loader takes hasten's checkpoint
    accelerator.save_state(str(tmp_path / "ours"))
    assert sorted(load_file(tmp_path / "ours" / "model.safetensors")) == ["0.bias", "0.weight", "1.bias"]
    fresh = tied()
    accelerate_checkpointing.load_accelerator_state(str(tmp_path / "ours"), [fresh], [], [], [], 0)
    assert all(torch.equal(saved[k], v) for k, v in fresh.state_dict().items())
    with torch.no_grad():
        model[0].weight.zero_()
    accelerator.load_state(str(tmp_path / "ours"))  # and hasten's own loader too
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())


def test_a_pickled_save_state_keeps_every_tied_name_as_accelerates_does(tmp_path):
    from hasten import Accelerator
    from hasten.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(tied())
    accelerator.save_state(str(tmp_path / "ours"), safe_serialization=False)
    (tmp_path / "theirs").mkdir()
    accelerate_checkpointing.save_accelerator_state(str(tmp_path / "theirs"), [model.state_dict()], [], [], [], 0, 0,
                                                    safe_serialization=False)
    ours = torch.load(tmp_path / "ours" / "pytorch_model.bin", weights_only=True)
    theirs = torch.load(tmp_path / "theirs" / "pytorch_model.bin", weights_only=True)
    assert sorted(ours) == sorted(theirs) == ["0.bias", "0.weight", "1.bias", "1.weight"]
