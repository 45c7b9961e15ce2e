"""Accelerate's ``accelerate.data_loader`` path: names only; the code lives in `hasten.data`.

`DataLoaderShard` (and `DataLoaderAdapter`, the base Accelerate's loaders share) is hasten's
`PreparedDataLoader`, `BatchSamplerShard` its
`ShardedBatchSampler`, `DataLoaderDispatcher` its `DispatchedDataLoader`;
`DataLoaderStateMixin` and `SkipDataLoader` are hasten's own of those names.

Example:
    >>> import torch
    >>> from torch.utils.data import DataLoader
    >>> from hasten.data_loader import prepare_data_loader
    >>> loader = prepare_data_loader(DataLoader(list(range(4)), batch_size=2), num_processes=2, process_index=1)
    >>> [batch.tolist() for batch in loader]
    [[2, 3]]
"""

from __future__ import annotations

from .data import (
    DataLoaderStateMixin,
    IterableDatasetShard,
    PreparedDataLoader,
    ShardedBatchSampler,
    SkipBatchSampler,
    SkipDataLoader,
    skip_first_batches,
)
from .data.dispatch import DispatchedDataLoader
from .data.loader import get_sampler
from .data.prepare import prepare_data_loader
from .data.samplers import SeedableRandomSampler

__all__ = [
    "BatchSamplerShard",
    "DataLoaderAdapter",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "DataLoaderStateMixin",
    "IterableDatasetShard",
    "SeedableRandomSampler",
    "SkipBatchSampler",
    "SkipDataLoader",
    "get_sampler",
    "prepare_data_loader",
    "skip_first_batches",
]

DataLoaderShard = PreparedDataLoader
DataLoaderAdapter = PreparedDataLoader
DataLoaderDispatcher = DispatchedDataLoader
BatchSamplerShard = ShardedBatchSampler
