"""FSDP2 (`fully_shard` on a `DeviceMesh`), one concept a module.

- `plugin.py`: `FullyShardedDataParallelPlugin`, the user's settings (no torch import: the config reader uses its choices);
- `strategy.py`: `FSDPStrategy`, set-up (mesh, wrap units, precision, activation checkpointing) and the hot path;
- `checkpoint.py`: full and sharded (DCP) state of models and optimizers, `merge_fsdp_weights`, and the peer's
  `save_fsdp_model` / `load_fsdp_model` / `save_fsdp_optimizer` / `load_fsdp_optimizer`.
"""
