"""Operations on nested batches as the peer's free functions (its path: ``accelerate.utils.operations``).

Two kinds, both over nested structures (lists, tuples, dicts of tensors):

- batch helpers: `find_batch_size`, `slice_tensors`, `concatenate`, `listify`, `convert_to_fp32`, ...;
- collectives with the peer's parameter names (`tensor=`, `object=`, `object_list=`) and defaults (its
  `reduce` averages by default; `Accelerator.reduce` sums), on `hasten.runtime.collectives`, plus
  `copy_tensor_to_devices` and `wait_for_everyone`.

Example:
    >>> import torch
    >>> from hasten.runtime.operations import gather, send_to_device
    >>> gather(tensor=torch.tensor([1, 2]))
    tensor([1, 2])
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch

from . import collectives
from .collectives import recursively_apply, send_to_device
from ..core.errors import DistributedOperationException

__all__ = [
    "TensorInformation",
    "get_data_structure",
    "initialize_tensors",
    "is_tensor_information",
    "DistributedOperationException",
    "broadcast",
    "broadcast_object_list",
    "concatenate",
    "convert_to_fp32",
    "copy_tensor_to_devices",
    "find_batch_size",
    "find_device",
    "gather",
    "gather_object",
    "honor_type",
    "ignorant_find_batch_size",
    "is_namedtuple",
    "is_torch_tensor",
    "listify",
    "pad_across_processes",
    "pad_input_tensors",
    "recursively_apply",
    "reduce",
    "send_to_device",
    "slice_tensors",
    "wait_for_everyone",
    "get_shape",
    "is_torch_xpu_tensor",
    "gather_tensor_shape",
    "TENSOR_TYPE_TO_INT",
    "TENSOR_INT_TO_DTYPE",
]

# Accelerate's codes for the dtypes a tensor shape message carries (`gather_tensor_shape`).
TENSOR_TYPE_TO_INT = {torch.float: 1, torch.double: 2, torch.half: 3, torch.bfloat16: 4, torch.uint8: 5, torch.int8: 6,
                      torch.int16: 7, torch.int32: 8, torch.int64: 9, torch.bool: 10}
TENSOR_INT_TO_DTYPE = {code: dtype for dtype, code in TENSOR_TYPE_TO_INT.items()}


def is_torch_tensor(tensor: Any) -> bool:
    """True for a `torch.Tensor`.

    Example:
        >>> is_torch_tensor(torch.ones(1)), is_torch_tensor([1])
        (True, False)
    """
    return isinstance(tensor, torch.Tensor)


def is_namedtuple(data: Any) -> bool:
    """True for a namedtuple instance.

    Example:
        >>> from collections import namedtuple
        >>> is_namedtuple(namedtuple("P", "x")(1)), is_namedtuple((1,))
        (True, False)
    """
    return isinstance(data, tuple) and hasattr(data, "_asdict") and hasattr(data, "_fields")


def honor_type(obj: Any, generator: Any) -> Any:
    """Build a sequence of `obj`'s type (namedtuples included) from `generator`.

    Example:
        >>> honor_type((1, 2), (x * 2 for x in (1, 2)))
        (2, 4)
    """
    if is_namedtuple(obj):
        return type(obj)(*list(generator))
    return type(obj)(generator)


@dataclass
class TensorInformation:
    """A tensor's shape and dtype, standing for it where only the layout of a batch travels.

    Example:
        >>> TensorInformation(shape=torch.Size([2]), dtype=torch.int64).shape
        torch.Size([2])
    """

    shape: torch.Size
    dtype: torch.dtype


def is_tensor_information(tensor_info: Any) -> bool:
    """True for a `TensorInformation`.

    Example:
        >>> is_tensor_information(TensorInformation(torch.Size([1]), torch.float32)), is_tensor_information(1)
        (True, False)
    """
    return isinstance(tensor_info, TensorInformation)


def get_data_structure(data: Any) -> Any:
    """`data` with each tensor replaced by its `TensorInformation` (nested lists, tuples, dicts kept).

    Example:
        >>> get_data_structure({"x": torch.zeros(2, 3)})["x"].shape
        torch.Size([2, 3])
    """
    return recursively_apply(lambda t: TensorInformation(shape=t.shape, dtype=t.dtype), data)


def initialize_tensors(data_structure: Any) -> Any:
    """The reverse of `get_data_structure`: an uninitialised tensor of each `TensorInformation`'s shape and dtype.

    Example:
        >>> initialize_tensors({"x": TensorInformation(torch.Size([2]), torch.int64)})["x"].dtype
        torch.int64
    """
    return recursively_apply(lambda info: torch.empty(*info.shape, dtype=info.dtype), data_structure,
                             test_type=is_tensor_information)


def gather(tensor: Any) -> Any:
    """Concatenate tensors (in nested structures) from all processes along dim 0.

    Example:
        >>> gather(tensor=torch.tensor([3]))
        tensor([3])
    """
    return collectives.gather(tensor)


def gather_object(object: Any) -> list[Any]:  # noqa: A002 - the peer's parameter name
    """Gather a picklable object from every process into one list.

    Example:
        >>> gather_object(object=["a"])
        ['a']
    """
    return collectives.gather_object(object)


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """Reduce tensors across processes ("mean" by default here, as at this import path; also "sum", "max", "min", "product").

    Example:
        >>> reduce(tensor=torch.tensor([2.0]))
        tensor([2.])
    """
    return collectives.reduce(tensor, reduction, scale)


def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Copy tensors from process `from_process` to all (in place, also returned).

    Example:
        >>> broadcast(tensor=torch.tensor([1]))
        tensor([1])
    """
    return collectives.broadcast(tensor, from_process)


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Replace the list's items, in place, with those of process `from_process`.

    Example:
        >>> broadcast_object_list(object_list=[1])
        [1]
    """
    return collectives.broadcast_object_list(object_list, from_process)


def pad_across_processes(tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
    """Pad tensors along `dim` to the largest size on any process.

    Example:
        >>> pad_across_processes(tensor=torch.tensor([1]))
        tensor([1])
    """
    return collectives.pad_across_processes(tensor, dim, pad_index, pad_first)


def listify(data: Any) -> Any:
    """Nested tensors turned into (nested) Python lists / numbers.

    Example:
        >>> listify({"a": torch.tensor([1, 2])})
        {'a': [1, 2]}
    """
    return recursively_apply(lambda t: t.tolist(), data)


def find_batch_size(data: Any) -> int:
    """The size of the first dimension of the first tensor found in `data`.

    Example:
        >>> find_batch_size({"x": torch.zeros(4, 2)})
        4
    """
    if isinstance(data, (list, tuple)):
        for item in data:
            try:
                return find_batch_size(item)
            except ValueError:
                continue
    elif isinstance(data, Mapping):
        for value in data.values():
            try:
                return find_batch_size(value)
            except ValueError:
                continue
    elif isinstance(data, torch.Tensor) and data.ndim > 0:
        return data.shape[0]
    raise ValueError(f"find_batch_size found no tensor with a batch dimension in a {type(data).__name__}; "
                     "pass a tensor or a nested structure holding one.")


def find_device(data: Any) -> torch.device | None:
    """The device of the first tensor found in nested lists, tuples and dicts; None when there is none.

    Example:
        >>> find_device([1, "a", {"x": torch.zeros(1)}])
        device(type='cpu')
        >>> find_device([1, "a"]) is None
        True
    """
    if isinstance(data, torch.Tensor):
        return data.device
    parts = data.values() if isinstance(data, Mapping) else data if isinstance(data, (list, tuple)) else ()
    for part in parts:
        device = find_device(part)
        if device is not None:
            return device
    return None


def ignorant_find_batch_size(data: Any) -> int | None:
    """`find_batch_size`, or None when there is no tensor.

    Example:
        >>> ignorant_find_batch_size(["text"]) is None
        True
    """
    try:
        return find_batch_size(data)
    except (ValueError, TypeError):
        return None


def pad_input_tensors(tensor: Any, batch_size: int, num_processes: int, dim: int = 0) -> Any:
    """Every tensor in `tensor` zero-padded along its first dim, by Accelerate's rule, so that a batch of
    `batch_size` can be cut into `num_processes` pipeline micro-batches (what `pippy_forward` does).

    The padded size is ``batch_size + to_pad`` with ``to_pad = num_processes - batch_size // num_processes``
    (``num_processes - batch_size`` for a batch smaller than `num_processes`), raised to the rows left over
    when that is below 1: Accelerate's arithmetic, kept so the same batch gives the same shapes. A leaf that
    is not a tensor is refused (TypeError).

    Example:
        >>> pad_input_tensors(torch.ones(3, 2), batch_size=3, num_processes=4).shape
        torch.Size([4, 2])
        >>> pad_input_tensors({"x": torch.ones(5)}, batch_size=5, num_processes=2)["x"]
        tensor([1., 1., 1., 1., 1., 0.])
    """
    def pad(value: torch.Tensor, batch_size: int, num_processes: int, dim: int = 0) -> torch.Tensor:
        per_process = batch_size // num_processes
        left_over = batch_size - per_process * num_processes
        to_pad = num_processes - (batch_size if per_process == 0 else per_process)
        if left_over > to_pad and to_pad < 1:
            to_pad = left_over - to_pad
        shape = list(value.shape)
        shape[0] = batch_size + to_pad
        padded = value.new_zeros(shape)
        padded[tuple(slice(0, value.shape[dim]) if i == dim else slice(None) for i in range(len(shape)))] = value
        return padded

    return recursively_apply(pad, tensor, error_on_other_type=True, batch_size=batch_size,
                             num_processes=num_processes, dim=dim)


def slice_tensors(data: Any, tensor_slice: slice | int, process_index: int | None = None,
                  num_processes: int | None = None) -> Any:
    """Every tensor in `data` indexed by `tensor_slice`.

    Example:
        >>> slice_tensors({"x": torch.arange(4)}, slice(0, 2))
        {'x': tensor([0, 1])}
    """
    return recursively_apply(lambda t: t[tensor_slice], data)


def concatenate(data: list[Any], dim: int = 0) -> Any:
    """Concatenate a list of (nested) batches of the same structure along `dim`.

    A single batch comes back as it is, whatever it holds (as Accelerate's); several batches must hold tensors
    where they hold anything.

    Example:
        >>> concatenate([{"x": torch.ones(1)}, {"x": torch.zeros(1)}])
        {'x': tensor([1., 0.])}
        >>> concatenate(["only batch"])
        'only batch'
    """
    first = data[0]
    if isinstance(first, (list, tuple)):
        return honor_type(first, (concatenate([d[i] for d in data], dim=dim) for i in range(len(first))))
    if isinstance(first, Mapping):
        return cast(Any, type(first))({k: concatenate([d[k] for d in data], dim=dim) for k in first.keys()})
    if isinstance(first, torch.Tensor):
        return torch.cat(data, dim=dim)
    if isinstance(data, (list, tuple)) and len(data) == 1:
        return first
    raise TypeError(f"Can only concatenate tensors but got {type(first)}: concatenate found {len(data)} batches "
                    "holding that; pass lists of tensors or nested structures of them.")


def convert_to_fp32(tensor: Any) -> Any:
    """fp16 / bf16 tensors in `tensor` cast to fp32; others unchanged.

    Example:
        >>> convert_to_fp32(torch.ones(1, dtype=torch.bfloat16)).dtype
        torch.float32
    """
    return recursively_apply(lambda t: t.float(), tensor,
                             test_type=lambda t: isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16))




def is_torch_xpu_tensor(tensor: Any) -> bool:
    """True for a tensor on an Intel XPU.

    Example:
        >>> is_torch_xpu_tensor(torch.ones(1))
        False
    """
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "xpu"


def get_shape(data: Any) -> Any:
    """The same nested structure with each tensor replaced by its shape, as a list of ints.

    Example:
        >>> get_shape({"x": torch.ones(2, 3), "y": [torch.ones(4)]})
        {'x': [2, 3], 'y': [[4]]}
    """
    return recursively_apply(lambda tensor: list(tensor.shape), data)


def gather_tensor_shape(tensor: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """The shape and dtype code (`TENSOR_TYPE_TO_INT`) of the tensor that exactly one process holds (others: None).

    Collective: call it on every process; every process gets the holder's
    shape as a 1-D int tensor and its dtype's code.

    Example:
        >>> gather_tensor_shape(torch.ones(2, 3))
        (tensor([2, 3]), 1)
    """
    described = [None if tensor is None else (list(tensor.shape), TENSOR_TYPE_TO_INT[tensor.dtype])]
    if collectives._distributed():
        described = [info for info in collectives.gather_object(described) if info is not None]
    if len(described) != 1 or described[0] is None:
        raise ValueError(f"gather_tensor_shape needs the tensor on exactly one process but {len(described)} passed "
                         "one; pass None on every other process.")
    shape, code = described[0]
    return torch.tensor(shape, dtype=torch.int64), code


def copy_tensor_to_devices(tensor: torch.Tensor | None = None) -> torch.Tensor:
    """Give every process the tensor that exactly one process holds (the others pass None).

    Unlike `broadcast`, the receiving processes need not know its shape or
    dtype. On a single process the tensor is returned as is.

    Example:
        >>> copy_tensor_to_devices(torch.tensor([1, 2, 3]))
        tensor([1, 2, 3])
    """
    if not collectives._distributed():
        if tensor is None:
            raise ValueError("copy_tensor_to_devices got None on the only process; pass the tensor to copy.")
        return tensor
    described = collectives.gather_object([None if tensor is None else (tuple(tensor.shape), tensor.dtype)])
    holders = [rank for rank, info in enumerate(described) if info is not None]
    if len(holders) != 1:
        raise ValueError(f"copy_tensor_to_devices needs the tensor on exactly one process but {len(holders)} passed "
                         "one; pass None on every other process.")
    if tensor is None:
        from .state import PartialState

        shape, dtype = described[holders[0]]
        tensor = torch.empty(shape, dtype=dtype, device=PartialState().device)
    return collectives.broadcast(tensor, from_process=holders[0])


def wait_for_everyone() -> None:
    """Barrier across every process of the run (nothing on one process).

    Example:
        >>> wait_for_everyone()
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        from ..process import watchdog

        with watchdog.waiting("wait_for_everyone"):
            dist.barrier()
