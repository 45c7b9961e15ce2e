"""Collectives over nested structures (dicts, lists, tuples, dataclasses of tensors).

Each function is a thin walk over the structure that hands each tensor to
the matching torch.distributed call; on a single process they return their
input unchanged.

Mismatches are errors, always: before gather / reduce / broadcast /
pad_across_processes, the processes compare one signature of (operation,
each tensor's shape and dtype): through shared memory when all run on this
machine under a hasten launcher (`host_board`, microseconds), else by one
tiny all-reduce (MAX) of a 2-element tensor. Different signatures (a gather of (4,) against
(2, 2), a gather on one rank and a reduce on another) raise on every rank
one sentence naming the operation, each rank's shapes and call site,
instead of a wrong result, a SIGABRT or a hang.

On the board, a small collective under gloo (`_exchange`: at most
`host_board.PAYLOAD` bytes per process) posts its tensors' bytes with the
signature and each process computes the result: no gloo call (~0.6x a raw
gloo all-reduce, where agreeing then calling gloo took ~2x); a float
reduce on 3+ processes still uses gloo, for its summation order. The path
follows from the signature, so processes that agree take the same one.
"""

from __future__ import annotations

import struct
import sys
import warnings
import zlib
from collections.abc import Mapping
from typing import Any, Callable, cast

import torch
import torch.distributed as dist

from ..core.errors import CollectiveOrderMismatch, CollectiveShapeMismatch, DistributedOperationException
from ..process import board as host_board, watchdog
from .nesting import recursively_apply, send_to_device

__all__ = [
    "DistributedOperationException",
    "CollectiveShapeMismatch",
    "CollectiveOrderMismatch",
    "recursively_apply",
    "send_to_device",
    "gather",
    "gather_object",
    "reduce",
    "broadcast",
    "broadcast_object_list",
    "pad_across_processes",
    "split_for_process",
    "CannotPadNestedTensorWarning",
]


class CannotPadNestedTensorWarning(UserWarning):
    """Warned by `pad_across_processes` when it meets a nested tensor, which it hands back unpadded.

    Example:
        >>> import warnings
        >>> nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(1)])
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     pad_across_processes(nested) is nested
        True
        >>> [w.category for w in caught] == [CannotPadNestedTensorWarning]
        True
    """


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _leaves(data: Any, test_type: Callable[[Any], bool] | None = None) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    recursively_apply(lambda t: found.append(t), data, test_type=test_type)
    return found


def _describe(tensors: list[torch.Tensor], ignore_dim: int | None) -> tuple[Any, ...]:
    described = []
    for t in tensors:
        shape: list[int | str] = list(t.shape)
        if ignore_dim is not None and -t.ndim <= ignore_dim < t.ndim:
            shape[ignore_dim % t.ndim] = "*"
        described.append((tuple(shape), str(t.dtype).replace("torch.", "")))
    return tuple(described)


def check_same_everywhere(operation: str, data: Any, ignore_dim: int | None = None) -> None:
    """Raise on every process if the processes are not all in `operation` with the same shapes and dtypes.

    When all agree this is a shared-memory board (one machine) or one
    all-reduce of two int64 numbers; the details are gathered only to write
    the error.
    """
    _agree(operation, _leaves(data), ignore_dim)


def _agree(operation: str, tensors: list[torch.Tensor], ignore_dim: int | None = None,
           payload: bytes | None = None) -> list[bytes] | None:
    """`check_same_everywhere`; with a `payload`, posted on the board beside the signature: every process's, by rank.

    A payload is for the board only: the caller sends one only when
    `host_board.board()` is not None and it fits (`host_board.PAYLOAD`), and
    every process decides that alike (the signature fixes its length).
    """
    described = _describe(tensors, ignore_dim)
    signature = zlib.crc32(repr((operation, described)).encode())
    board = host_board.board()
    if board is not None:  # every process on this machine: shared memory, no collective, no device sync
        differ, payloads = board.share(signature, payload or b"")
        if differ is None:
            return payloads if payload is not None else None
    else:
        device = tensors[0].device if tensors else torch.device("cpu")
        if dist.get_backend() == "nccl" and device.type != "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        both = torch.tensor([signature, -signature], dtype=torch.int64, device=device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        if int(both[0]) == -int(both[1]):
            return None
    reports: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(reports, (operation, described, watchdog.call_site(sys._getframe(1))))
    operations = {report[0] for report in reports}
    if len(operations) > 1:
        listing = ", ".join(f"rank {r} in {op} at {site}" for r, (op, _, site) in enumerate(reports))
        raise CollectiveOrderMismatch(f"the processes called different collectives: {listing}; every process must make the "
                           "same collective calls in the same order.")

    def shapes(entry: tuple[Any, ...]) -> str:
        return "; ".join(f"{shape if len(shape) != 1 else '(' + str(shape[0]) + ',)'} {dtype}" for shape, dtype in entry)

    listing = ", ".join(f"rank {r}: {shapes(described)} at {site}" for r, (_, described, site) in enumerate(reports))
    hint = ("use pad_across_processes first or gather_object for ragged data" if operation == "gather"
            else "make every process pass tensors of the same shapes and dtypes")
    raise CollectiveShapeMismatch(f"{operation} needs the same shape and dtype on every process, got {listing}; {hint}.")


_gloo: tuple[Any, bool] = (None, False)  # (the default group, whether its backend is gloo): asked once per group


def _on_gloo() -> bool:
    global _gloo
    group = dist.GroupMember.WORLD
    if _gloo[0] is not group:
        _gloo = (group, dist.get_backend() == "gloo")
    return _gloo[1]


_ALIGN = 16  # each tensor's bytes start at a multiple of this in a payload (the largest element: complex128)


def _exchange(operation: str, tensors: list[torch.Tensor]) -> list[torch.Tensor] | None:
    """Agree on `operation` and share the tensors' values through the board; None: too big, or no board (use the network).

    Returns, per tensor, every process's values stacked in rank order: shape
    (world size, *tensor's shape), on the CPU. Only under gloo: NCCL's
    tensors stay on their device.
    """
    if not _on_gloo() or host_board.board() is None:
        return None
    spans, offset = [], 0
    for t in tensors:
        spans.append(offset)
        offset += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
    if offset > host_board.PAYLOAD:
        return None
    parts = []
    for t in tensors:
        flat = t.detach().reshape(-1).contiguous()  # a 1-D strided tensor stays strided through reshape
        data = (flat if flat.device.type == "cpu" else flat.cpu()).view(torch.uint8).numpy().tobytes()
        parts.append(data + bytes(-len(data) % _ALIGN))
    payloads = _agree(operation, tensors, payload=b"".join(parts) or b"\0")
    assert payloads is not None
    world = len(payloads)
    table = torch.frombuffer(bytearray(b"".join(payloads)), dtype=torch.uint8).view(world, -1)
    return [table[:, start:start + t.numel() * t.element_size()].view(t.dtype).reshape(world, *t.shape)
            for t, start in zip(tensors, spans)]


# torch 2.13 renamed all_gather_into_tensor (older versions only have the old name).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _gather_one(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach()  # gather is not differentiable; a tensor that requires grad must not change that
    if tensor.ndim == 0:
        tensor = tensor.reshape(1)
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
    with watchdog.waiting("gather"):
        tensors = _leaves(data)
        shared = _exchange("gather", tensors)
        if shared is None:
            _agree("gather", tensors)
            return recursively_apply(_gather_one, data)
        values = iter(shared)
        return recursively_apply(lambda t: next(values).reshape(-1, *t.shape[1:]).to(t.device), data)


def gather_object(obj: Any) -> list[Any]:
    """Gather a picklable object from every process into a flat list (lists are concatenated).

    On one process the object comes back as it is, as in Accelerate.

    Example:
        >>> gather_object(["a"])
        ['a']
    """
    if not _distributed():
        return obj
    gathered: list[Any] = [None] * dist.get_world_size()
    with watchdog.waiting("gather_object"):
        dist.all_gather_object(gathered, obj)
    if isinstance(obj, (list, tuple)):
        return [item for part in gathered for item in part]
    return gathered


_REDUCE_OPS = {"sum": "SUM", "mean": "SUM", "max": "MAX", "min": "MIN", "product": "PRODUCT"}


def reduce(data: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
    """Reduce each tensor across processes ("sum", "mean", "max", "min", "product"); every process gets the result.

    The inputs are not modified; integer tensors averaged with "mean" become floating point.

    Example:
        >>> reduce(torch.tensor([1.0, 2.0]), "mean")
        tensor([1., 2.])
    """
    if reduction not in _REDUCE_OPS:
        raise ValueError(f"reduction={reduction!r} is not one of {tuple(_REDUCE_OPS)}.")
    distributed = _distributed()
    op = getattr(dist.ReduceOp, _REDUCE_OPS[reduction]) if distributed else None

    def finish(out: torch.Tensor) -> torch.Tensor:
        if reduction == "mean" and distributed:
            out = out / dist.get_world_size()
        return out * scale if scale != 1.0 else out

    def reduce_one(tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.detach().clone().contiguous()
        if distributed:
            dist.all_reduce(out, op=op)
        return finish(out)

    if not distributed:
        return recursively_apply(reduce_one, data)
    with watchdog.waiting("reduce"):
        tensors = _leaves(data)
        # in rank order floats could differ from gloo's sum (Accelerate's) in the last bit on 3+ processes
        exact = dist.get_world_size() <= 2 or not any(t.is_floating_point() or t.is_complex() for t in tensors)
        shared = _exchange("reduce", tensors) if exact else None
        if shared is None:
            _agree("reduce", tensors)
            return recursively_apply(reduce_one, data)
        values = iter(shared)
        return recursively_apply(lambda t: finish(_combine(next(values), reduction).to(t.device)), data)


def _combine(rows: torch.Tensor, reduction: str) -> torch.Tensor:
    """Reduce every process's values (`rows`, in rank order) the way the all-reduce would, in the tensor's dtype."""
    if rows.is_complex() and reduction not in ("sum", "mean"):  # what torch.distributed says on the network path
        raise ValueError(f"all_reduce does not support {getattr(dist.ReduceOp, _REDUCE_OPS[reduction])} on complex tensors")
    out = rows[0].clone()
    for row in rows[1:]:
        if reduction in ("sum", "mean"):
            out.add_(row)
        elif reduction == "product":
            out.mul_(row)
        else:
            torch.maximum(out, row, out=out) if reduction == "max" else torch.minimum(out, row, out=out)
    return out


def broadcast(data: Any, from_process: int = 0) -> Any:
    """Copy each tensor from process `from_process` to all processes (in place, also returned).

    Example:
        >>> broadcast(torch.tensor([3]))
        tensor([3])
    """
    if not _distributed():
        return data
    with watchdog.waiting("broadcast"):
        tensors = _leaves(data)
        shared = _exchange("broadcast", tensors)
        if shared is None:
            _agree("broadcast", tensors)
            return recursively_apply(_broadcast_one(from_process), data)
        values = iter(shared)

        def copy_one(tensor: torch.Tensor) -> torch.Tensor:
            source = next(values)[from_process]
            if dist.get_rank() != from_process:
                with torch.no_grad():
                    tensor.copy_(source)
            return tensor

        return recursively_apply(copy_one, data)


def _broadcast_one(from_process: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def broadcast_one(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.is_contiguous():
            dist.broadcast(tensor, src=from_process)
            return tensor
        staged = tensor.contiguous()
        dist.broadcast(staged, src=from_process)
        with torch.no_grad():
            tensor.copy_(staged)
        return tensor

    return broadcast_one


def broadcast_object_list(objects: list[Any], from_process: int = 0) -> list[Any]:
    """Replace the list's items, in place, with those of process `from_process`.

    Example:
        >>> broadcast_object_list([1, "a"])
        [1, 'a']
    """
    if _distributed():
        with watchdog.waiting("broadcast_object_list"):
            dist.broadcast_object_list(objects, src=from_process)
    return objects


def pad_across_processes(data: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
    """Pad each tensor along `dim` to the largest size any process has, so they can be gathered.

    Example:
        >>> pad_across_processes(torch.tensor([1, 2]))
        tensor([1, 2])
    """
    if _holds_nested(data):  # on one process too, as Accelerate: its warning says the data is left as it is
        warnings.warn("Cannot pad nested tensors without more information (their rows differ in length); "
                      "leaving them unpadded.", CannotPadNestedTensorWarning, stacklevel=2)
    if not _distributed():
        return data
    with watchdog.waiting("pad_across_processes"):
        tensors = _leaves(data, _is_flat_tensor)
        if host_board.board() is None or 8 * len(tensors) > host_board.PAYLOAD:
            _agree("pad_across_processes", tensors, ignore_dim=dim)
            return recursively_apply(_pad_one(dim, pad_index, pad_first, None), data, test_type=_is_flat_tensor)
        # On one machine each process's sizes along `dim` travel with the agreement: no collective at all.
        mine = [t.shape[dim] if -t.ndim <= dim < t.ndim else -1 for t in tensors]
        payloads = _agree("pad_across_processes", tensors, ignore_dim=dim, payload=struct.pack(f"<{len(mine)}q", *mine))
        assert payloads is not None
        longest = iter([max(sizes) for sizes in zip(*(struct.unpack(f"<{len(mine)}q", p) for p in payloads))])
        return recursively_apply(_pad_one(dim, pad_index, pad_first, lambda: next(longest)), data,
                                 test_type=_is_flat_tensor)


def _is_nested_tensor(data: Any) -> bool:
    return isinstance(data, torch.Tensor) and data.is_nested


def _is_flat_tensor(data: Any) -> bool:
    """A tensor `pad_across_processes` can pad (nested tensors are left as they are)."""
    return isinstance(data, torch.Tensor) and not data.is_nested


def _holds_nested(data: Any) -> bool:
    found: list[bool] = []
    recursively_apply(lambda t: found.append(True), data, test_type=_is_nested_tensor)
    return bool(found)


def _pad_one(dim: int, pad_index: int, pad_first: bool,
             shared: Callable[[], int] | None) -> Callable[[torch.Tensor], torch.Tensor]:
    def pad_one(tensor: torch.Tensor) -> torch.Tensor:
        longest = shared() if shared is not None else 0  # taken for every tensor, in order (skipped ones too)
        if dim >= tensor.ndim or dim < -tensor.ndim:
            return tensor
        axis = dim % tensor.ndim
        if shared is None:
            longest = int(_gather_one(torch.tensor([tensor.shape[axis]], device=tensor.device)).max())
        if longest == tensor.shape[axis]:
            return tensor
        shape = list(tensor.shape)
        shape[axis] = longest
        out = tensor.new_full(shape, pad_index)
        index = [slice(None)] * tensor.ndim
        index[axis] = slice(longest - tensor.shape[axis], longest) if pad_first else slice(0, tensor.shape[axis])
        out[tuple(index)] = tensor
        return out

    return pad_one


def share_bounds(length: int, index: int, count: int) -> tuple[int, int]:
    """[start, end) of part `index` of `count` near-equal contiguous parts of `length` items."""
    base, extra = divmod(length, count)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def _is_row_dataset(inputs: Any) -> bool:
    """A table of rows with `select(indices)` (Hugging Face `datasets.Dataset` and look-alikes)."""
    return (not isinstance(inputs, (Mapping, list, tuple, torch.Tensor, str)) and callable(getattr(inputs, "select", None))
            and hasattr(inputs, "__len__"))


def split_for_process(inputs: Any, index: int, count: int, apply_padding: bool = False) -> Any:
    """Process `index`'s contiguous share of `inputs` (list, tuple, tensor, dict of those, or a `datasets.Dataset`).

    With `apply_padding`, a shorter share is completed with the last element of `inputs` (as Accelerate's).

    Example:
        >>> split_for_process([1, 2, 3], index=1, count=2)
        [3]
        >>> split_for_process([1, 2, 3], index=1, count=2, apply_padding=True)
        [3, 3]
    """
    if count == 1:
        return inputs
    if _is_row_dataset(inputs):  # a `datasets.Dataset`: slicing it gives a dict of columns, so select rows instead
        length = len(inputs)
        start, end = share_bounds(length, index, count)
        rows = list(range(start, end))
        if apply_padding and length:
            rows += [length - 1] * (-(-length // count) - len(rows))
        return inputs.select(rows)
    if isinstance(inputs, Mapping):
        lengths = {len(v) for v in inputs.values()}
        if len(lengths) > 1:
            raise ValueError("split_between_processes needs every value of the dict to have the same length.")
        return cast(Any, type(inputs))({k: split_for_process(v, index, count, apply_padding) for k, v in inputs.items()})
    length = len(inputs)
    start, end = share_bounds(length, index, count)
    share = inputs[start:end]
    if apply_padding:
        target = -(-length // count)
        missing = target - (end - start)
        if missing and length:
            filler = inputs[-1:]
            if isinstance(share, torch.Tensor):
                share = torch.cat([share] + [filler] * missing)
            else:
                share = share + type(share)(filler) * missing
    return share
