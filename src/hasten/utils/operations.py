"""The peer's ``accelerate.utils.operations`` path: names only; the code lives in `hasten.operations`
(batch helpers and collectives with the peer's parameter names) and `hasten.collectives`.

Example:
    >>> import torch
    >>> from hasten.utils.operations import gather, send_to_device
    >>> gather(tensor=torch.tensor([1, 2]))
    tensor([1, 2])
"""

from ..collectives import recursively_apply, send_to_device
from ..errors import DistributedOperationException
from ..operations import (
    broadcast,
    broadcast_object_list,
    concatenate,
    convert_to_fp32,
    copy_tensor_to_devices,
    find_batch_size,
    gather,
    gather_object,
    honor_type,
    ignorant_find_batch_size,
    is_namedtuple,
    is_torch_tensor,
    listify,
    pad_across_processes,
    pad_input_tensors,
    reduce,
    slice_tensors,
)

__all__ = [
    "DistributedOperationException",
    "broadcast",
    "broadcast_object_list",
    "concatenate",
    "convert_to_fp32",
    "copy_tensor_to_devices",
    "find_batch_size",
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
]
