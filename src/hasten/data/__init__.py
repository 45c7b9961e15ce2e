"""Data loading across processes: sample order, sharding, the prepared loader and its position.

- `order.py`: which sample each position of an epoch visits (seekable, O(1) memory when keyed).
- `sharding.py`: which batches (or items) belong to this process.
- `loader.py`: `PreparedDataLoader`, `skip_first_batches`.
- `prepare.py`: `prepare_data_loader` (what Accelerate's does to a loader).
- `dispatch.py`: `DispatchedDataLoader` (process 0 reads, every process gets its rows).

Example:
    >>> from hasten.data import prepare_data_loader
"""

from .loader import LoaderCursor, PreparedDataLoader, skip_first_batches
from .prepare import prepare_data_loader
from .order import SampleOrder, keyed_permutation
from .sharding import IterableDatasetShard, ShardedBatchSampler, SkipBatchSampler, seek_batches

__all__ = [
    "IterableDatasetShard",
    "LoaderCursor",
    "PreparedDataLoader",
    "SampleOrder",
    "ShardedBatchSampler",
    "SkipBatchSampler",
    "keyed_permutation",
    "prepare_data_loader",
    "seek_batches",
    "skip_first_batches",
]
