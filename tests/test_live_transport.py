"""A live heal's state on the wire (`hasten.process.live.transport`): JSON and raw tensor bytes, never a pickle.

The replica group is a stand-in that hands each sent tensor to the matching receive (by tag), so a real model's,
optimizer's and scheduler's state goes through the very send and receive a heal runs; the multi-process heals (DDP,
FSDP2 sharded within machines, two hosts) are tests/test_live.py's.
"""

from __future__ import annotations

import builtins
import json
import pickle
import subprocess
import sys
from datetime import timedelta

import numpy as np
import pytest
import torch

from hasten.process.live.transport import FORMAT, MAX_LAYOUT_BYTES, HealRefused, JsonTransport

TIMEOUT = timedelta(seconds=5)


class _Done:
    def wait(self, timeout=None):
        return True


class Wire:
    """Two ends of a replica group in one process: what one end sends under a tag, the other receives."""

    def __init__(self):
        self.queued: dict[int, list[torch.Tensor]] = {}

    def send(self, tensors, rank, tag):
        self.queued.setdefault(tag, []).append(tensors[0].clone())
        return _Done()

    def recv(self, tensors, rank, tag):
        tensors[0].copy_(self.queued[tag].pop(0))
        return _Done()


def _trained():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, betas=(0.8, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (step + 1))
    for _ in range(3):
        model(torch.randn(5, 3)).square().mean().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return model, optimizer, scheduler


def test_a_models_optimizers_and_schedulers_state_arrives_whole_and_loads_into_a_fresh_machine():
    model, optimizer, scheduler = _trained()
    state = {"user": {"hasten": {"models": [model.state_dict()], "optimizers": [optimizer.state_dict()],
                                 "schedulers": [scheduler.state_dict()], "optimizer_steps": 3,
                                 "loaders": [{"epoch": 1, "step": 4, "order": {"seed": np.int64(7), "perm": None}}],
                                 "view": torch.arange(12.0).reshape(3, 4)[:, 1::2]}},  # strided: sent contiguous
             "torchft": {"step": 3, "batches_committed": 6}}
    wire = Wire()
    JsonTransport(wire, TIMEOUT).send_checkpoint([1], 3, state, TIMEOUT)
    got = JsonTransport(wire, TIMEOUT).recv_checkpoint(0, FORMAT, 3, TIMEOUT)
    mine = got["user"]["hasten"]
    assert got["torchft"] == {"step": 3, "batches_committed": 6} and mine["optimizer_steps"] == 3
    assert mine["loaders"] == [{"epoch": 1, "step": 4, "order": {"seed": 7, "perm": None}}]
    assert torch.equal(mine["view"], torch.tensor([[1.0, 3.0], [5.0, 7.0], [9.0, 11.0]]))
    fresh_model, fresh_optimizer, fresh_scheduler = _fresh()
    fresh_model.load_state_dict(mine["models"][0])
    fresh_optimizer.load_state_dict(mine["optimizers"][0])
    fresh_scheduler.load_state_dict(mine["schedulers"][0])
    for key, value in model.state_dict().items():
        assert torch.equal(fresh_model.state_dict()[key], value) and fresh_model.state_dict()[key].dtype == value.dtype
    assert fresh_optimizer.state_dict()["param_groups"] == optimizer.state_dict()["param_groups"]  # betas a tuple
    for index, entry in optimizer.state_dict()["state"].items():  # (keys are ints: kept)
        assert all(torch.equal(fresh_optimizer.state_dict()["state"][index][k], v) for k, v in entry.items())
    assert fresh_scheduler.state_dict() == scheduler.state_dict()
    assert not any(wire.queued.values())  # every tensor sent was received


def _fresh():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.5)
    return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


class _Payload:
    def __reduce__(self):
        return exec, ("import builtins; builtins.hasten_test_payload_ran = True",)


def _sent(raw: bytes) -> Wire:
    wire = Wire()
    wire.send([torch.tensor([len(raw)], dtype=torch.int64)], 1, tag=1)
    wire.send([torch.frombuffer(bytearray(raw), dtype=torch.uint8)], 1, tag=2)
    return wire


def test_a_peer_that_sends_a_pickle_is_refused_and_nothing_it_holds_runs():
    # torchft's own transport unpickles the peer's layout: this payload would run on the joiner
    raw = pickle.dumps({"step": 3, "state": _Payload()})
    with pytest.raises(HealRefused, match="not hasten's JSON layout") as refused:
        JsonTransport(_sent(raw), TIMEOUT).recv_checkpoint(0, FORMAT, 3, TIMEOUT)
    assert not hasattr(builtins, "hasten_test_payload_ran")
    assert str(refused.value).count(". ") == 0  # one sentence
    pickle.loads(raw)  # (the control: unpickled, it does run)
    assert builtins.hasten_test_payload_ran
    del builtins.hasten_test_payload_ran


@pytest.mark.parametrize("layout, words", [
    ({"format": "other/9", "step": 3, "state": []}, "format 'other/9'"),
    ({"format": FORMAT, "step": 2, "state": []}, "state of step 2 for step 3"),
    ({"format": FORMAT, "step": 3, "state": [{"__live_tensor__": 0, "dtype": "load", "shape": [2]}]}, "not a tensor"),
    ({"format": FORMAT, "step": 3, "state": [{"__live_tensor__": 0, "dtype": "float32", "shape": [-1]}]},
     "not a tensor"),
    ({"format": FORMAT, "step": 3, "state": {"__reduce__": "os.system"}}, "not of hasten's format"),
    ({"format": FORMAT, "step": 3, "state": {"__live_dict__": "ab"}}, "not of hasten's format"),
    ({"format": FORMAT, "step": 3, "state": [{"__live_tensor__": 0, "dtype": "float32", "shape": [1],
                                              "placements": ["S0"], "global_shape": [2], "global_stride": [1]}]},
     "models are not sharded"),
])
def test_a_layout_that_breaks_the_format_is_refused_in_one_sentence_before_any_tensor_is_taken(layout, words):
    wire = _sent(json.dumps(layout).encode())
    wire.queued[3] = [torch.zeros(4, dtype=torch.uint8)]
    with pytest.raises(HealRefused) as refused:
        JsonTransport(wire, TIMEOUT).recv_checkpoint(0, FORMAT, 3, TIMEOUT)
    assert words in str(refused.value) and str(refused.value).count(". ") == 0
    assert len(wire.queued[3]) == (0 if "sharded" in words else 1)  # (a tensor is taken only once it is described)


def test_an_oversized_announcement_or_another_transport_is_refused():
    wire = Wire()
    wire.send([torch.tensor([MAX_LAYOUT_BYTES + 1], dtype=torch.int64)], 1, tag=1)
    with pytest.raises(HealRefused, match="at most"):
        JsonTransport(wire, TIMEOUT).recv_checkpoint(0, FORMAT, 3, TIMEOUT)
    with pytest.raises(HealRefused, match="same hasten version"):
        JsonTransport(Wire(), TIMEOUT).recv_checkpoint(0, "<n/a>", 3, TIMEOUT)  # (torchft's PGTransport's metadata)


_SHARDED = r"""
import os, tempfile, torch, torch.distributed as dist
from datetime import timedelta
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, Shard, Replicate
import sys; sys.path.insert(0, sys.argv[1])
from test_live_transport import Wire, TIMEOUT
from hasten.process.live.transport import FORMAT, JsonTransport
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))
weight = distribute_tensor(torch.arange(6.0).reshape(3, 2), mesh, [Shard(0)])
bias = distribute_tensor(torch.ones(2), mesh, [Replicate()])
wire = Wire()
JsonTransport(wire, TIMEOUT).send_checkpoint([1], 5, {"w": weight, "b": bias}, TIMEOUT)
got = JsonTransport(wire, TIMEOUT, mesh=lambda: mesh).recv_checkpoint(0, FORMAT, 5, TIMEOUT)
assert type(got["w"]).__name__ == "DTensor" and got["w"].placements == (Shard(0),) and got["w"].device_mesh is mesh
assert got["b"].placements == (Replicate(),) and got["w"].shape == (3, 2)
assert torch.equal(got["w"].full_tensor(), weight.full_tensor()) and torch.equal(got["b"].to_local(), torch.ones(2))
dist.destroy_process_group()
print("sharded ok")
"""


def test_a_sharded_tensor_arrives_as_its_shard_on_the_receivers_own_mesh():
    result = subprocess.run([sys.executable, "-c", _SHARDED, str(__import__("pathlib").Path(__file__).parent)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "sharded ok" in result.stdout, result.stderr[-3000:]
