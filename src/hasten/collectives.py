"""Collectives over nested structures (dicts, lists, tuples, dataclasses of tensors).

Each function is a thin walk over the structure that hands each tensor to
the matching torch.distributed call; on a single process they return their
input unchanged. With debug mode on (`HASTEN_DEBUG=1` or `hasten launch
--debug`), gather/reduce first compare shapes across ranks and raise one
clear error instead of hanging or returning garbage on a mismatch.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping
from typing import Any, Callable

import torch
import torch.distributed as dist

__all__ = [
    "recursively_apply",
    "send_to_device",
    "gather",
    "gather_object",
    "reduce",
    "broadcast",
    "broadcast_object_list",
    "pad_across_processes",
    "split_for_process",
]


def recursively_apply(function: Callable[[torch.Tensor], Any], data: Any) -> Any:
    """Apply `function` to every tensor inside nested containers, keeping their types.

    Example:
        >>> recursively_apply(lambda t: t * 2, {"a": [torch.tensor(1)]})
        {'a': [tensor(2)]}
    """
    if isinstance(data, torch.Tensor):
        return function(data)
    if isinstance(data, (list, tuple)):
        items = [recursively_apply(function, item) for item in data]
        if hasattr(data, "_fields"):  # namedtuple
            return type(data)(*items)
        return type(data)(items)
    if isinstance(data, Mapping):
        applied = {key: recursively_apply(function, value) for key, value in data.items()}
        try:
            return type(data)(applied)  # dict, OrderedDict, BatchEncoding-like mappings
        except TypeError:
            return applied
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        changes = {f.name: recursively_apply(function, getattr(data, f.name)) for f in dataclasses.fields(data) if f.init}
        return dataclasses.replace(data, **changes)
    return data


def send_to_device(data: Any, device: torch.device | str, non_blocking: bool = False) -> Any:
    """Move every tensor in a nested batch to `device`; other leaves are kept.

    Objects with their own `.to` (e.g. a `transformers` BatchEncoding) use it.

    Example:
        >>> send_to_device({"x": torch.zeros(2)}, "cpu")["x"].device
        device(type='cpu')
    """
    if not isinstance(data, (torch.Tensor, list, tuple, Mapping)) and hasattr(data, "to") and not dataclasses.is_dataclass(data):
        try:
            return data.to(device, non_blocking=non_blocking)
        except TypeError:
            return data.to(device)
    return recursively_apply(lambda t: t.to(device, non_blocking=non_blocking), data)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@functools.lru_cache(maxsize=1)
def _debug() -> bool:
    """Debug mode, read once: the shape checks cost a collective each."""
    from .launch_spec import LaunchSpec

    return os.environ.get("HASTEN_DEBUG", "") not in ("", "0") or LaunchSpec.from_env().debug


def _check_shapes(operation: str, tensor: torch.Tensor) -> None:
    shapes: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(shapes, (tuple(tensor.shape), str(tensor.dtype)))
    if len(set(shapes)) > 1:
        listing = ", ".join(f"rank {r}: {s[0]} {s[1]}" for r, s in enumerate(shapes))
        raise ValueError(
            f"{operation} needs the same shape and dtype on every process, got {listing}; "
            "use pad_across_processes first or gather_object for ragged data."
        )


# torch 2.13 renamed all_gather_into_tensor (older versions only have the old name).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _gather_one(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.ndim == 0:
        tensor = tensor[None]
    tensor = tensor.contiguous()
    out = torch.empty((dist.get_world_size() * tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    _all_gather_single(out, tensor)
    return out


def gather(data: Any) -> Any:
    """Concatenate each tensor across processes along dim 0 (0-d tensors become 1-d).

    Example:
        >>> gather(torch.tensor([1, 2]))  # one process: unchanged
        tensor([1, 2])
    """
    if not _distributed():
        return data
    if _debug():
        recursively_apply(lambda t: _check_shapes("gather", t), data)
    return recursively_apply(_gather_one, data)


def gather_object(obj: Any) -> list[Any]:
    """Gather a picklable object from every process into a flat list (lists are concatenated).

    Example:
        >>> gather_object(["a"])
        ['a']
    """
    if not _distributed():
        return list(obj) if isinstance(obj, (list, tuple)) else [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    if isinstance(obj, (list, tuple)):
        return [item for part in gathered for item in part]
    return gathered


_REDUCE_OPS = ("sum", "mean")


def reduce(data: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
    """Sum (or average) each tensor across processes; every process receives the result.

    Example:
        >>> reduce(torch.tensor([1.0, 2.0]), "mean")
        tensor([1., 2.])
    """
    if reduction not in _REDUCE_OPS:
        raise ValueError(f"reduction={reduction!r} is not one of {_REDUCE_OPS}.")

    def reduce_one(tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.clone()
        if _distributed():
            dist.all_reduce(out, op=dist.ReduceOp.SUM)
            if reduction == "mean":
                out = out / dist.get_world_size()
        if scale != 1.0:
            out = out * scale
        return out

    if _distributed() and _debug():
        recursively_apply(lambda t: _check_shapes("reduce", t), data)
    return recursively_apply(reduce_one, data)


def broadcast(data: Any, from_process: int = 0) -> Any:
    """Copy each tensor from process `from_process` to all processes (in place, also returned).

    Example:
        >>> broadcast(torch.tensor([3]))
        tensor([3])
    """
    if not _distributed():
        return data

    def broadcast_one(tensor: torch.Tensor) -> torch.Tensor:
        dist.broadcast(tensor, src=from_process)
        return tensor

    return recursively_apply(broadcast_one, data)


def broadcast_object_list(objects: list[Any], from_process: int = 0) -> list[Any]:
    """Replace the list's items, in place, with those of process `from_process`.

    Example:
        >>> broadcast_object_list([1, "a"])
        [1, 'a']
    """
    if _distributed():
        dist.broadcast_object_list(objects, src=from_process)
    return objects


def pad_across_processes(data: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
    """Pad each tensor along `dim` to the largest size any process has, so they can be gathered.

    Example:
        >>> pad_across_processes(torch.tensor([1, 2]))
        tensor([1, 2])
    """
    if not _distributed():
        return data

    def pad_one(tensor: torch.Tensor) -> torch.Tensor:
        if dim >= tensor.ndim or dim < -tensor.ndim:
            return tensor
        axis = dim % tensor.ndim
        size = torch.tensor([tensor.shape[axis]], device=tensor.device)
        sizes = _gather_one(size)
        longest = int(sizes.max())
        if longest == tensor.shape[axis]:
            return tensor
        shape = list(tensor.shape)
        shape[axis] = longest
        out = tensor.new_full(shape, pad_index)
        index = [slice(None)] * tensor.ndim
        index[axis] = slice(longest - tensor.shape[axis], longest) if pad_first else slice(0, tensor.shape[axis])
        out[tuple(index)] = tensor
        return out

    return recursively_apply(pad_one, data)


def share_bounds(length: int, index: int, count: int) -> tuple[int, int]:
    """[start, end) of part `index` of `count` near-equal contiguous parts of `length` items."""
    base, extra = divmod(length, count)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def split_for_process(inputs: Any, index: int, count: int, apply_padding: bool = False) -> Any:
    """Process `index`'s contiguous share of `inputs` (list, tuple, tensor, or dict of those).

    Example:
        >>> split_for_process([1, 2, 3], index=1, count=2)
        [3]
        >>> split_for_process([1, 2, 3], index=1, count=2, apply_padding=True)
        [3, 3]
    """
    if count == 1:
        return inputs
    if isinstance(inputs, Mapping):
        lengths = {len(v) for v in inputs.values()}
        if len(lengths) > 1:
            raise ValueError("split_between_processes needs every value of the dict to have the same length.")
        return type(inputs)({k: split_for_process(v, index, count, apply_padding) for k, v in inputs.items()})
    length = len(inputs)
    start, end = share_bounds(length, index, count)
    share = inputs[start:end]
    if apply_padding:
        target = -(-length // count)
        missing = target - (end - start)
        if missing and length:
            filler = inputs[end - 1 : end] if end > start else inputs[-1:]
            if isinstance(share, torch.Tensor):
                share = torch.cat([share] + [filler] * missing)
            else:
                share = share + type(share)(filler) * missing
    return share
