"""Model sizes, device maps and checkpoint loading, at the peer's path (``accelerate.utils.modeling``).

The code lives in `hasten.big_modeling` (`sizes.py`, `device_map.py`,
`loading.py`, `offload.py`, `model_helpers.py`).

Example:
    >>> import torch
    >>> from hasten.utils.modeling import compute_module_sizes
    >>> compute_module_sizes(torch.nn.Linear(2, 2))[""]
    24
"""

from ..big_modeling.device_map import (
    check_device_map,
    clean_device_map,
    fallback_allocate,
    get_balanced_memory,
    get_module_leaves,
    get_module_size_with_ties,
    infer_auto_device_map,
)
from ..big_modeling.loading import load_checkpoint_in_model
from ..big_modeling.model_helpers import (
    align_module_device,
    calculate_maximum_sizes,
    check_device_same,
    check_tied_parameters_in_config,
    get_grad_scaler,
    get_mixed_precision_context_manager,
    get_state_dict_from_offload,
    get_state_dict_offloaded_model,
    has_offloaded_params,
    id_tensor_storage,
    is_peft_model,
    load_state_dict,
)
from ..big_modeling.offload import load_offloaded_weights
from ..core.accelerators import get_accelerator_free_memory, normalize_device
from ..big_modeling.sizes import (
    check_tied_parameters_on_same_device,
    compute_module_sizes,
    compute_module_total_buffer_size,
    convert_file_size_to_int,
    dtype_byte_size,
    find_tied_parameters,
    get_max_layer_size,
    get_max_memory,
    get_non_persistent_buffers,
    named_module_tensors,
    retie_parameters,
    set_module_tensor_to_device,
)

__all__ = [
    "align_module_device",
    "calculate_maximum_sizes",
    "check_device_map",
    "check_device_same",
    "check_tied_parameters_in_config",
    "check_tied_parameters_on_same_device",
    "clean_device_map",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "dtype_byte_size",
    "fallback_allocate",
    "find_tied_parameters",
    "get_accelerator_free_memory",
    "get_balanced_memory",
    "get_grad_scaler",
    "get_max_layer_size",
    "get_max_memory",
    "get_mixed_precision_context_manager",
    "get_module_leaves",
    "get_module_size_with_ties",
    "get_non_persistent_buffers",
    "get_state_dict_from_offload",
    "get_state_dict_offloaded_model",
    "has_offloaded_params",
    "id_tensor_storage",
    "infer_auto_device_map",
    "is_peft_model",
    "normalize_device",
    "load_checkpoint_in_model",
    "load_offloaded_weights",
    "load_state_dict",
    "named_module_tensors",
    "retie_parameters",
    "set_module_tensor_to_device",
]
