"""The peer's ``accelerate.utils.operations`` path: names only; the code lives in `hasten.runtime.operations`
(batch helpers and collectives with the peer's parameter names), `hasten.runtime.collectives`,
`hasten.runtime.verify` (debug-mode checks) and `hasten.strategies.deepspeed.helpers` (`GatheredParameters`).

Example:
    >>> import torch
    >>> from hasten.utils.operations import gather, send_to_device
    >>> gather(tensor=torch.tensor([1, 2]))
    tensor([1, 2])
"""

from ..runtime.collectives import CannotPadNestedTensorWarning, recursively_apply, send_to_device
from ..runtime.precision import ConvertOutputsToFp32, convert_outputs_to_fp32
from ..core.errors import DistributedOperationException
from ..runtime.verify import chained_operation, verify_operation
from ..strategies.deepspeed.helpers import GatheredParameters
from ..runtime.operations import (
    broadcast,
    broadcast_object_list,
    concatenate,
    convert_to_fp32,
    copy_tensor_to_devices,
    TensorInformation,
    find_batch_size,
    gather_tensor_shape,
    get_shape,
    is_torch_xpu_tensor,
    find_device,
    gather,
    get_data_structure,
    initialize_tensors,
    is_tensor_information,
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
    "CannotPadNestedTensorWarning",
    "ConvertOutputsToFp32",
    "convert_outputs_to_fp32",
    "find_device",
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
    "GatheredParameters",
    "chained_operation",
    "gather_tensor_shape",
    "get_shape",
    "is_torch_xpu_tensor",
    "verify_operation",
]
