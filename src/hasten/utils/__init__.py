"""Helpers under the import path users know (``from hasten.utils import set_seed, gather, ...``).

Example:
    >>> from hasten.utils import set_seed
    >>> set_seed(0)
"""

from __future__ import annotations

from ..collectives import (
    broadcast,
    broadcast_object_list,
    gather,
    gather_object,
    pad_across_processes,
    recursively_apply,
    reduce,
    send_to_device,
)
from ..checkpointing.constants import (
    MODEL_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SAFE_MODEL_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    SAMPLER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
)
from ..checkpointing.model_files import load_checkpoint_in_model
from ..checkpointing.project import ProjectConfiguration
from ..data import skip_first_batches
from ..options import (
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    DistributedType,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProfileKwargs,
)
from ..saving import load, save
from ..seeding import set_seed
from ..throughput import ThroughputMeter, count_flops_per_sample, peak_flops

__all__ = [
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "pad_across_processes",
    "recursively_apply",
    "reduce",
    "send_to_device",
    "skip_first_batches",
    "DataLoaderConfiguration",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "GradientAccumulationPlugin",
    "GradScalerKwargs",
    "InitProcessGroupKwargs",
    "ProfileKwargs",
    "save",
    "load",
    "set_seed",
    "ThroughputMeter",
    "count_flops_per_sample",
    "peak_flops",
    "ProjectConfiguration",
    "load_checkpoint_in_model",
    "MODEL_NAME",
    "OPTIMIZER_NAME",
    "RNG_STATE_NAME",
    "SAFE_MODEL_NAME",
    "SAFE_WEIGHTS_INDEX_NAME",
    "SAFE_WEIGHTS_NAME",
    "SAMPLER_NAME",
    "SCALER_NAME",
    "SCHEDULER_NAME",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
]

# Engine plugins and helpers, imported on first use (they pull in torch.distributed pieces).
_LAZY = {
    "FullyShardedDataParallelPlugin": "..fsdp_plugin",
    "DeepSpeedPlugin": "..deepspeed_plugin",
    "DummyOptim": "..deepspeed_plugin",
    "DummyScheduler": "..deepspeed_plugin",
    "HfDeepSpeedConfig": "..deepspeed_plugin",
    "ParallelismConfig": "..parallelism_config",
    "merge_fsdp_weights": ".fsdp_utils",
    "save_fsdp_model": ".fsdp_utils",
    "load_fsdp_model": ".fsdp_utils",
    "save_fsdp_optimizer": ".fsdp_utils",
    "load_fsdp_optimizer": ".fsdp_utils",
}
__all__ += sorted(_LAZY)


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hasten.utils' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
