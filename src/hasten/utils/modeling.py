"""Model sizes, device maps and checkpoint loading, at the peer's path (``accelerate.utils.modeling``).

The code lives in `hasten.big_modeling` (`sizes.py`, `device_map.py`,
`loading.py`, `offload.py`).

Example:
    >>> import torch
    >>> from hasten.utils.modeling import compute_module_sizes
    >>> compute_module_sizes(torch.nn.Linear(2, 2))[""]
    24
"""

from ..big_modeling.device_map import check_device_map, clean_device_map, get_balanced_memory, infer_auto_device_map
from ..big_modeling.loading import load_checkpoint_in_model
from ..big_modeling.offload import load_offloaded_weights
from ..big_modeling.sizes import (
    check_tied_parameters_on_same_device,
    compute_module_sizes,
    compute_module_total_buffer_size,
    convert_file_size_to_int,
    dtype_byte_size,
    find_tied_parameters,
    get_max_layer_size,
    get_max_memory,
    named_module_tensors,
    retie_parameters,
    set_module_tensor_to_device,
)

__all__ = [
    "check_device_map",
    "check_tied_parameters_on_same_device",
    "clean_device_map",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "dtype_byte_size",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_max_layer_size",
    "get_max_memory",
    "infer_auto_device_map",
    "load_checkpoint_in_model",
    "load_offloaded_weights",
    "named_module_tensors",
    "retie_parameters",
    "set_module_tensor_to_device",
]
