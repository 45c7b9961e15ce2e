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
from .data import skip_first_batches
from .options import (
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    DistributedType,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
)
from .saving import save
from .seeding import set_seed

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
    "save",
    "set_seed",
]
