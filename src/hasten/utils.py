"""Helpers under the import path users know (``from hasten.utils import set_seed, gather, ...``).

Example:
    >>> from hasten.utils import set_seed
    >>> set_seed(0)
"""

from __future__ import annotations

from .collectives import (
    broadcast,
    broadcast_object_list,
    gather,
    gather_object,
    pad_across_processes,
    recursively_apply,
    reduce,
    send_to_device,
)
from .checkpointing.constants import (
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
from .checkpointing.model_files import load_checkpoint_in_model
from .checkpointing.project import ProjectConfiguration
from .data import skip_first_batches
from .options import (
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    DistributedType,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProfileKwargs,
)
from .saving import load, save
from .seeding import set_seed
from .throughput import ThroughputMeter, count_flops_per_sample, peak_flops

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
