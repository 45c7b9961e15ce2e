"""How a live peer's state reaches a joining machine: the tensors as raw bytes over the group, the rest as JSON.

torchft's own `PGTransport` sends the state's layout (its tree, each tensor's shape and dtype, every value that is not
a tensor) as a pickle, which the joiner unpickles: any process that joins the lighthouse's quorum and is picked to heal
another could run code on it. `JsonTransport` sends the same state with nothing to unpickle: the layout is JSON (each
dict, list and tuple marked, a tensor by its number, dtype and shape, every other value through `core.jsonable`), each
tensor's description is checked before bytes are taken for it, and the bytes go over the replica group as torchft's
do. A sharded tensor (FSDP2 within each machine: a DTensor) goes as this process's shard with its placements and is
rebuilt on the receiver's own device mesh (the sender's mesh is not the receiver's to use). A message that breaks
these rules is refused in one sentence (`HealRefused`): the joiner is then not healed and says so, it runs nothing.

It has torchft's `CheckpointTransport` methods (`metadata`, `send_checkpoint`, `recv_checkpoint`,
`disallow_checkpoint`, `shutdown`), which are all its `Manager` calls.

Example:
    >>> import torch
    >>> state = {"w": torch.arange(6.0).reshape(2, 3).t(), "betas": (0.9, 0.999), "step": 7, "name": None}
    >>> layout, tensors = describe(state, step=3)
    >>> [t.shape for t in tensors], layout["step"]
    ([torch.Size([3, 2])], 3)
    >>> rebuilt = rebuild(layout, [t.clone() for t in tensors], step=3)
    >>> torch.equal(rebuilt["w"], state["w"]), rebuilt["betas"], rebuilt["step"], rebuilt["name"]
    (True, (0.9, 0.999), 7, None)
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any, Callable

from ...core.jsonable import decode, encode

__all__ = ["HealRefused", "JsonTransport", "describe", "rebuild"]

FORMAT = "hasten-live-state/1"
MAX_LAYOUT_BYTES = 256 << 20  # a layout description larger than this is refused before it is received
_TENSOR, _DICT, _TUPLE, _VALUE = "__live_tensor__", "__live_dict__", "__live_tuple__", "__live_value__"


class HealRefused(ValueError):
    """A live peer's state message that breaks the format: nothing of it is applied (the joiner is not healed)."""


def _sharded(tensor: Any) -> bool:
    return hasattr(tensor, "_local_tensor") and hasattr(tensor, "placements")


def _placement(placement: Any) -> str:
    if placement.is_shard():
        return f"S{placement.dim}"
    if placement.is_replicate():
        return "R"
    raise HealRefused(f"a live peer's state holds a tensor placed {placement!r}; only Shard and Replicate are sent.")


def describe(state: Any, step: int) -> tuple[dict[str, Any], list[Any]]:
    """(the JSON-ready layout of `state`, its tensors as they go over the wire: contiguous, this process's shard)."""
    import torch

    tensors: list[Any] = []

    def walk(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            local = value._local_tensor if _sharded(value) else value  # type: ignore[attr-defined]
            entry: dict[str, Any] = {_TENSOR: len(tensors), "dtype": str(local.dtype).removeprefix("torch."),
                                     "shape": list(local.shape)}
            if local is not value:
                entry.update(placements=[_placement(p) for p in value.placements],  # type: ignore[attr-defined]
                             global_shape=list(value.shape),
                             global_stride=list(value.stride()))
            tensors.append(local.detach().contiguous())
            return entry
        if isinstance(value, dict):
            return {_DICT: [[encode(key), walk(item)] for key, item in value.items()]}
        if isinstance(value, list):
            return [walk(item) for item in value]
        if isinstance(value, tuple):
            return {_TUPLE: [walk(item) for item in value]}
        return {_VALUE: encode(value)}

    return {"format": FORMAT, "step": int(step), "state": walk(state)}, tensors


def _tensor_entries(layout: Any) -> list[dict[str, Any]]:
    """Every tensor description of a received layout, in order, each checked (dtype, shape); refused otherwise."""
    import torch

    found: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict) and _TENSOR in node:
            dtype = getattr(torch, str(node.get("dtype")), None)
            shape = node.get("shape")
            if not isinstance(dtype, torch.dtype) or not isinstance(shape, list) or \
                    not all(isinstance(n, int) and n >= 0 for n in shape) or node[_TENSOR] != len(found):
                raise HealRefused(f"a live peer described a tensor as {node!r}, which is not a tensor hasten sends.")
            found.append(node)
        elif isinstance(node, dict) and set(node) == {_DICT} and isinstance(node[_DICT], list) and \
                all(isinstance(pair, list) and len(pair) == 2 for pair in node[_DICT]):
            for _, item in node[_DICT]:
                walk(item)
        elif isinstance(node, dict) and set(node) == {_TUPLE} and isinstance(node[_TUPLE], list):
            walk(node[_TUPLE])
        elif not (isinstance(node, dict) and set(node) == {_VALUE}):
            raise HealRefused(f"a live peer's state holds {str(node)[:80]!r}, which is not of hasten's format.")

    walk(layout)
    return found


def check_layout(raw: bytes, step: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The layout a peer sent, parsed as JSON (never unpickled) and checked: (layout, its tensor descriptions)."""
    try:
        layout = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise HealRefused("a live peer sent a state that is not hasten's JSON layout (a pickle, or another "
                          "version's); it was not read: run the same hasten version on every machine.") from None
    return layout, _checked(layout, step)


def _checked(layout: Any, step: int) -> list[dict[str, Any]]:
    if not isinstance(layout, dict) or layout.get("format") != FORMAT:
        named = layout.get("format") if isinstance(layout, dict) else type(layout).__name__
        raise HealRefused(f"a live peer sent a state of format {str(named)[:40]!r}, not {FORMAT!r}: run the same "
                          "hasten version on every machine.")
    if layout.get("step") != step:
        raise HealRefused(f"a live peer sent the state of step {layout.get('step')!r} for step {step}.")
    return _tensor_entries(layout.get("state"))


def rebuild(layout: dict[str, Any], tensors: list[Any], step: int, mesh: Callable[[], Any] | None = None) -> Any:
    """The state `describe` gave, from its layout and the received tensors (`mesh()`: the device mesh a sharded
    tensor is rebuilt on, the receiver's own)."""
    entries = _checked(layout, step)
    if len(entries) != len(tensors):
        raise HealRefused(f"a live peer described {len(entries)} tensors and sent {len(tensors)}.")

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(item) for item in node]
        if _TENSOR in node:
            tensor = tensors[node[_TENSOR]]
            return tensor if "placements" not in node else _on_mesh(tensor, node, mesh)
        if _DICT in node:
            return {decode(key): walk(item) for key, item in node[_DICT]}
        if _TUPLE in node:
            return tuple(walk(item) for item in node[_TUPLE])
        return decode(node[_VALUE])

    return walk(layout["state"])


def _on_mesh(local: Any, node: dict[str, Any], mesh: Callable[[], Any] | None) -> Any:
    import torch
    from torch.distributed.tensor import DTensor, Replicate, Shard

    device_mesh = mesh() if mesh is not None else None
    if device_mesh is None:
        raise HealRefused("a live peer sent a sharded tensor, but this machine's models are not sharded: run the same "
                          "script and engine on every machine.")
    placements: list[Any] = []
    for text in node.get("placements", []):
        if text == "R":
            placements.append(Replicate())
        elif isinstance(text, str) and text[:1] == "S" and text[1:].isdigit() and int(text[1:]) < len(node["shape"]):
            placements.append(Shard(int(text[1:])))
        else:
            raise HealRefused(f"a live peer sent a tensor placed {text!r}; only Shard and Replicate are sent.")
    shape, stride = node.get("global_shape"), node.get("global_stride")
    if len(placements) != device_mesh.ndim or not isinstance(shape, list) or not isinstance(stride, list) or \
            not all(isinstance(n, int) for n in shape + stride) or len(shape) != len(stride):
        raise HealRefused(f"a live peer sent a sharded tensor {node!r} that does not fit this machine's mesh.")
    return DTensor.from_local(local, device_mesh, placements, run_check=False, shape=torch.Size(shape),
                              stride=tuple(stride))


class JsonTransport:
    """torchft's checkpoint transport for live heals, without pickles (see the module doc).

    `pg` is the replica group torchft's manager reconfigures each quorum; `mesh()` gives the device mesh this
    machine's sharded tensors live on (None when nothing is sharded), asked only when a sharded tensor arrives.
    """

    def __init__(self, pg: Any, timeout: timedelta, mesh: Callable[[], Any] | None = None) -> None:
        self._pg, self._timeout, self._mesh = pg, timeout, mesh

    def metadata(self) -> str:
        return FORMAT

    def disallow_checkpoint(self) -> None:  # (the sends are waited for inside send_checkpoint)
        pass

    def shutdown(self, wait: bool = True) -> None:
        pass

    def send_checkpoint(self, dst_ranks: list[int], step: int, state_dict: Any, timeout: timedelta) -> None:
        import torch

        layout, tensors = describe(state_dict, step)
        raw = json.dumps(layout).encode("utf-8")
        length = torch.tensor([len(raw)], dtype=torch.int64)
        body = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        works = [work for rank in dst_ranks
                 for work in (self._pg.send([length], rank, tag=1), self._pg.send([body], rank, tag=2))]
        for work in works:
            work.wait(timeout)
        for number, tensor in enumerate(tensors):
            if tensor.numel() == 0:
                continue
            wire = tensor.reshape(-1).view(torch.uint8)
            for work in [self._pg.send([wire], rank, tag=3 + number) for rank in dst_ranks]:
                work.wait(timeout)  # one tensor in flight: a copy made for the wire is freed before the next

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
        import torch

        if metadata != FORMAT:
            raise HealRefused(f"the live peer that heals this machine sends {metadata[:40]!r}, not {FORMAT!r}: run the "
                              "same hasten version on every machine.")
        length = torch.zeros(1, dtype=torch.int64)
        self._pg.recv([length], src_rank, tag=1).wait(timeout)
        size = int(length.item())
        if not 0 < size <= MAX_LAYOUT_BYTES:
            raise HealRefused(f"a live peer announced a state layout of {size} bytes; at most {MAX_LAYOUT_BYTES} are "
                              "taken.")
        body = torch.empty(size, dtype=torch.uint8)
        self._pg.recv([body], src_rank, tag=2).wait(timeout)
        layout, entries = check_layout(body.numpy().tobytes(), step)
        tensors = []
        for number, entry in enumerate(entries):
            tensor = torch.empty(entry["shape"], dtype=getattr(torch, entry["dtype"]))
            if tensor.numel():
                self._pg.recv([tensor.reshape(-1).view(torch.uint8)], src_rank, tag=3 + number).wait(timeout)
            tensors.append(tensor)
        return rebuild(layout, tensors, step, self._mesh)
