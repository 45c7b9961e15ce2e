"""Data loading across processes: sample order, sharding, the prepared loader and its position.

- `order.py`: which sample each position of an epoch visits (seekable, O(1) memory when keyed).
- `sharding.py`: which batches (or items) belong to this process.
- `loader.py`: `PreparedDataLoader`, `prepare_data_loader`, `skip_first_batches`.

Example:
    >>> from hasten.data import prepare_data_loader
"""

from .loader import LoaderCursor, PreparedDataLoader, prepare_data_loader, skip_first_batches
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
