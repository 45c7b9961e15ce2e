"""Big models on small machines: empty init, device maps, offload, lazy checkpoint loading, memory estimates.

Modules (one concept each):

- `sizes.py`: bytes per module/tensor, memory strings, tied parameters.
- `device_map.py`: `infer_auto_device_map`, `get_balanced_memory`, `check_device_map`.
- `offload.py`: weights offloaded to disk as raw memory-mapped files plus an index.
- `loading.py`: `load_checkpoint_in_model` (lazy, tensor by tensor, honouring a device map).
- `hooks.py`: forward hooks that move weights in before a block runs and out after.
- `dispatch.py`: `init_empty_weights`, `dispatch_model`, `cpu_offload`, `disk_offload`,
  `load_checkpoint_and_dispatch`.
- `casting.py`: layerwise casting (weights stored in a small dtype, cast up per layer for its forward).
- `bnb.py`, `bnb_loading.py`, `bnb_params.py`, `bnb_checkpoint.py`: bitsandbytes 8-/4-bit loading
  (`load_and_quantize_model`; layers converted, weights quantized as they are placed, 8-bit scales on disk).
- `model_helpers.py`: the rest of ``accelerate.utils.modeling`` (offloaded state dicts, `align_module_device`,
  `load_state_dict`, autocast and grad-scaler helpers).
- `estimate.py`: `hasten estimate-memory`.

The names below are those of ``accelerate.big_modeling``; they are imported
on first use, so `hasten estimate-memory` reading safetensors headers never
imports torch.

Example:
    >>> import torch
    >>> from hasten.big_modeling import init_empty_weights
    >>> with init_empty_weights():
    ...     layer = torch.nn.Linear(4, 4)
    >>> layer.weight.device
    device(type='meta')
"""

from __future__ import annotations

from ..core.lazy import lazy_exports

_EXPORTS = {
    "init_empty_weights": "dispatch",
    "init_on_device": "dispatch",
    "cpu_offload": "dispatch",
    "cpu_offload_with_hook": "dispatch",
    "disk_offload": "dispatch",
    "dispatch_model": "dispatch",
    "load_checkpoint_and_dispatch": "dispatch",
    "load_checkpoint_in_model": "loading",
    "infer_auto_device_map": "device_map",
    "get_balanced_memory": "device_map",
    "attach_layerwise_casting_hooks": "casting",
    "_refuse_recurrent_layers_under_sequence_parallelism": "model_helpers",
}
__all__ = sorted(name for name in _EXPORTS if not name.startswith("_"))
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


