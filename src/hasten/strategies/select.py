"""`select_strategy`: the engine and its precision, chosen together and once per Accelerator."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn

from ..runtime.precision import make_precision_policy
from .base import AccumulationState, Strategy, notice_once

if TYPE_CHECKING:
    from .deepspeed.plugin import DeepSpeedPlugin
    from .fsdp.plugin import FullyShardedDataParallelPlugin
    from .parallel.mesh import ParallelismConfig

__all__ = ["select_strategy"]


def select_strategy(
    device: torch.device,
    world_size: int,
    mixed_precision: str = "no",
    *,
    ddp_kwargs: dict[str, Any] | None = None,
    ddp_comm_hook: Callable[[nn.Module], None] | None = None,
    scaler_kwargs: dict[str, Any] | None = None,
    fsdp_plugin: FullyShardedDataParallelPlugin | None = None,
    deepspeed_plugin: DeepSpeedPlugin | dict[str, DeepSpeedPlugin] | None = None,
    parallelism_config: ParallelismConfig | None = None,
    gradient_state: AccumulationState | None = None,
    sync_each_batch: bool = False,
    accumulation_given: bool = True,
    elastic_batch: Any = None,
) -> Strategy:
    """Choose the strategy and its precision together, once.

    DeepSpeed when a `DeepSpeedPlugin` (or a dict of named ones) is given, FSDP2 for an FSDP plugin or a
    `ParallelismConfig` that shards or splits tensors, else DDP for several
    processes and a single device for one. (The sharded engines are imported
    only when chosen.) `elastic_batch` is an elastic run's `ElasticBatch` for DeepSpeed (its engine's accumulation at
    this size, and the recipe at MAX that the config's numbers describe).

    Example:
        >>> strategy = select_strategy(torch.device("cpu"), 1, "bf16")
        >>> type(strategy).__name__, strategy.precision.name
        ('SingleDeviceStrategy', 'bf16')
    """
    if fsdp_plugin is not None and deepspeed_plugin is not None:
        raise ValueError("FSDP and DeepSpeed cannot be used together; pass fsdp_plugin or deepspeed_plugin, not both.")
    if deepspeed_plugin is not None:
        from .deepspeed.strategy import DeepSpeedStrategy

        return DeepSpeedStrategy.create(device, world_size, mixed_precision, deepspeed_plugin,
                                        gradient_state=gradient_state, parallelism_config=parallelism_config,
                                        accumulation_given=accumulation_given, elastic_batch=elastic_batch)
    if parallelism_config is not None and getattr(parallelism_config, "sp_size", 1) > 1:
        raise ValueError(f"ParallelismConfig(sp_size={parallelism_config.sp_size}) is DeepSpeed's Ulysses sequence "
                         "parallelism; pass deepspeed_plugin=DeepSpeedPlugin(...) (or launch with --use_deepspeed).")
    if fsdp_plugin is not None:
        from .fsdp.plugin import FullyShardedDataParallelPlugin

        if not isinstance(fsdp_plugin, FullyShardedDataParallelPlugin):
            raise TypeError(f"fsdp_plugin must be a hasten FullyShardedDataParallelPlugin, got {type(fsdp_plugin).__name__}.")
    if fsdp_plugin is not None and world_size == 1 and parallelism_config is None:
        import torch.distributed as dist

        if not dist.is_initialized():  # `python script.py`: one process, no group to shard over
            notice_once("FSDP with one process has nothing to shard; this run trains unsharded (launch with "
                    "--num_processes N to shard).")
            fsdp_plugin = None
    if fsdp_plugin is not None or (parallelism_config is not None and parallelism_config.needs_sharded_engine):
        from .fsdp.strategy import FSDPStrategy

        return FSDPStrategy.create(device, world_size, mixed_precision, fsdp_plugin, parallelism_config=parallelism_config,
                                   scaler_kwargs=scaler_kwargs, sync_each_batch=sync_each_batch)
    precision = make_precision_policy(mixed_precision, device, scaler_kwargs)
    if world_size > 1:
        from .ddp.strategy import DDPStrategy  # each engine is imported when chosen

        strategy: Strategy = DDPStrategy(device, precision, ddp_kwargs=ddp_kwargs, comm_hook=ddp_comm_hook)
    else:
        from .single import SingleDeviceStrategy

        strategy = SingleDeviceStrategy(device, precision)
    strategy.sync_each_batch = sync_each_batch
    return strategy
