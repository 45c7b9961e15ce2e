"""Big models on small machines: empty init, device maps, offload, lazy checkpoint loading, memory estimates.

Modules (one concept each):

- `sizes.py`: bytes per module/tensor, memory strings, tied parameters.
- `device_map.py`: `infer_auto_device_map`, `get_balanced_memory`, `check_device_map`.
- `offload.py`: weights offloaded to disk as raw memory-mapped files plus an index.
- `loading.py`: `load_checkpoint_in_model` (lazy, tensor by tensor, honouring a device map).
- `hooks.py`: forward hooks that move weights in before a block runs and out after.
- `dispatch.py`: `init_empty_weights`, `dispatch_model`, `cpu_offload`, `disk_offload`,
  `load_checkpoint_and_dispatch`.
"""
