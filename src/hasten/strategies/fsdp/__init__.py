"""FSDP2 (`fully_shard` on a `DeviceMesh`), one concept a module.

- `plugin.py`: `FullyShardedDataParallelPlugin`, the user's settings with Accelerate's values and torch's types
  (`plugin_fields.py`: the names and their enums; importing either imports no torch: the config reader uses the choices);
- `strategy.py`: `FSDPStrategy`, set-up (mesh, wrap units, precision, activation checkpointing) and the hot path;
- `checkpoint.py`: full and sharded (DCP) state of models and optimizers, `merge_fsdp_weights`, and the peer's
  `save_fsdp_model` / `load_fsdp_model` / `save_fsdp_optimizer` / `load_fsdp_optimizer`.
"""
