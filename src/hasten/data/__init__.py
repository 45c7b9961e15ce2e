"""Data loading across processes: sample order, sharding, the prepared loader and its position.

- `order.py`: which sample each position of an epoch visits (seekable, O(1) memory when keyed).
- `sharding.py`: which batches (or items) belong to this process.
- `position.py`: a loader's position (`LoaderCursor`), that position as state, `DataLoaderStateMixin`.
- `loader.py`: `PreparedDataLoader` (Accelerate's `DataLoaderShard`).
- `skipping.py`: `skip_first_batches`, `SkipDataLoader`.
- `stateful.py`: loaders that are torchdata `StatefulDataLoader`s (``use_stateful_dataloader=True``).
- `prepare.py`: `prepare_data_loader` (what Accelerate's does to a loader).
- `dispatch.py`: `DispatchedDataLoader` (process 0 reads, every process gets its rows).

Example:
    >>> from hasten.data import prepare_data_loader
"""

from .loader import PreparedDataLoader
from .position import DataLoaderStateMixin, LoaderCursor
from .prepare import prepare_data_loader
from .skipping import SkipDataLoader, skip_first_batches
from .order import SampleOrder, keyed_permutation
from .sharding import IterableDatasetShard, ShardedBatchSampler, SkipBatchSampler, seek_batches

__all__ = [
    "DataLoaderStateMixin",
    "IterableDatasetShard",
    "LoaderCursor",
    "PreparedDataLoader",
    "SampleOrder",
    "ShardedBatchSampler",
    "SkipBatchSampler",
    "SkipDataLoader",
    "keyed_permutation",
    "prepare_data_loader",
    "seek_batches",
    "skip_first_batches",
]
