"""Sharding batches (map-style) and items (iterable datasets) across processes.

Sharding is done on the *batch sampler* (map-style) or on the item stream
(iterable datasets), so that N processes with batch B see, step for step,
exactly the samples one process with batch N*B would see. That is what
makes a 1-process and an N-process run reach the same parameters.

- `split_batches=False` (default): the user's batch size is per process;
  the global batch is N*B, and process r takes the r-th of each N batches.
- `split_batches=True`: the user's batch size is global; each batch is cut
  into N equal parts.
- `even_batches=True` (default): the last global batch is completed with
  samples from the start of the epoch, so all processes step equally often
  (`gather_for_metrics` drops those duplicates again).
- `even_batches=False`: every sample is seen exactly once; processes may
  get one batch fewer.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable, Iterator, cast

import torch
from torch.utils.data import BatchSampler, IterableDataset

from ..runtime.collectives import share_bounds
from .order import SampleOrder

__all__ = ["ShardedBatchSampler", "SkipBatchSampler", "IterableDatasetShard", "can_seek_batches", "seek_batches"]


def seekable_order(batch_sampler: Any) -> SampleOrder | None:
    """The `SampleOrder` under a plain torch BatchSampler (whose batches are then computable without drawing)."""
    if type(batch_sampler) is BatchSampler and isinstance(batch_sampler.sampler, SampleOrder):
        return batch_sampler.sampler
    return None


def can_seek_batches(batch_sampler: Any) -> bool:
    """Can `seek_batches` place the next pass of `batch_sampler` (a batch sampler over hasten's order)?"""
    if isinstance(batch_sampler, ShardedBatchSampler):
        return batch_sampler.batch_size is not None and seekable_order(batch_sampler.batch_sampler) is not None
    return seekable_order(batch_sampler) is not None


def seek_batches(batch_sampler: Any, batches: int) -> bool:
    """Make the next pass of `batch_sampler` start after `batches` of its batches, without drawing them.

    Returns False when the batch sampler cannot seek (a custom one): the
    caller then skips by iterating (indices only, no sample is loaded).
    """
    if isinstance(batch_sampler, ShardedBatchSampler):
        return batch_sampler.seek(batches)
    order = seekable_order(batch_sampler)
    if order is None:
        return False
    order.seek(min(batches * batch_sampler.batch_size, order.num_samples))
    return True


def _cycle_fill(indices: list[Any], source: list[Any], count: int) -> list[Any]:
    """`indices` extended with `count` items taken cyclically from `source`."""
    if count <= 0:
        return indices
    return indices + list(itertools.islice(itertools.cycle(source), count))


class ShardedBatchSampler(BatchSampler):
    """This process's batches of an inner batch sampler (the layout of Accelerate's `BatchSamplerShard`).

    Every process gets the same number of batches of the same size unless
    `even_batches` is False; the last global batch is completed with the
    epoch's first samples. With `split_batches` each inner batch is cut into
    `num_processes` parts of ``batch_size // num_processes``.

    Example:
        >>> inner = BatchSampler(range(10), batch_size=2, drop_last=False)
        >>> list(ShardedBatchSampler(inner, num_processes=2, process_index=1))
        [[2, 3], [6, 7], [0, 1]]
        >>> list(ShardedBatchSampler(inner, num_processes=2, process_index=1, even_batches=False))
        [[2, 3], [6, 7]]
    """

    def __init__(
        self,
        batch_sampler: Iterable[list[int]],
        num_processes: int,
        process_index: int,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:  # (BatchSampler's own __init__ is not called: this one wraps another)
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        # None when the wrapped sampler has none (BatchSampler's own attribute is always an int).
        self.batch_size: int | None = getattr(batch_sampler, "batch_size", None)  # type: ignore[assignment]
        self.drop_last: bool = bool(getattr(batch_sampler, "drop_last", False))
        self._seeked = False  # did the current pass start after a seek (then the epoch's start is computed)?
        if split_batches and (self.batch_size is None or self.batch_size % num_processes):
            raise ValueError(
                f"split_batches=True needs the DataLoader's batch_size ({self.batch_size}) to be a multiple of the "
                f"number of processes ({num_processes}): each takes an equal part of every batch, so the batch size "
                "must be a round multiple of it; change the batch size or use split_batches=False."
            )

    @property
    def sampler(self) -> Any:  # type: ignore[override]  # read through to the wrapped sampler, never set
        return getattr(self.batch_sampler, "sampler", None)

    @property
    def global_batch_size(self) -> int | None:
        if self.batch_size is None:
            return None
        return self.batch_size if self.split_batches else self.batch_size * self.num_processes

    @property
    def total_samples(self) -> int | None:
        """Samples the inner sampler yields per epoch (None when unknown)."""
        try:
            return len(self.sampler)  # type: ignore[arg-type]
        except TypeError:
            return None

    @property
    def padded_remainder(self) -> int:
        """Real samples in the last global batch when it is padded, else 0."""
        total, global_batch = self.total_samples, self.global_batch_size
        if not self.even_batches or self.drop_last or total is None or not global_batch:
            return 0
        return total % global_batch

    def set_epoch(self, epoch: int) -> None:
        for holder in (self.batch_sampler, self.sampler):
            if hasattr(holder, "set_epoch"):
                holder.set_epoch(epoch)

    def seek(self, batches: int) -> bool:
        """Start the next pass after `batches` of this process's batches (see `seek_batches`)."""
        order = seekable_order(self.batch_sampler)
        if order is None or self.batch_size is None:
            return False
        inner = batches if self.split_batches else batches * self.num_processes
        order.seek(min(inner * self.batch_size, order.num_samples))
        self._seeked = True
        return True

    def _epoch_start(self, count: int) -> list[list[int]]:
        """The epoch's first `count` inner batches, computed (used after a seek, when they were not drawn)."""
        order, size = seekable_order(self.batch_sampler), self.batch_size
        batches = [order.indices(i * size, (i + 1) * size) for i in range(count)]  # type: ignore[union-attr,operator]
        return [b for b in batches if b]

    def __len__(self) -> int:
        inner = len(self.batch_sampler)  # type: ignore[arg-type]
        n, r = self.num_processes, self.process_index
        if self.split_batches:  # every process counts every inner batch (the short last one may leave some out)
            return inner
        if self.drop_last:
            return inner // n
        if self.even_batches:
            return -(-inner // n)
        return inner // n + (1 if r < inner % n else 0)

    def __iter__(self) -> Iterator[list[int]]:
        seeked, self._seeked = self._seeked, False
        if self.split_batches:
            return self._iter_split(seeked)
        return self._iter_strided(seeked)

    def _iter_strided(self, seeked: bool = False) -> Iterator[list[int]]:
        order = seekable_order(self.batch_sampler)
        if order is not None:
            return self._iter_strided_slices(order, seeked)
        return self._iter_strided_batches(seeked)

    def _iter_strided_slices(self, order: SampleOrder, seeked: bool) -> Iterator[list[int]]:
        """The batches `_iter_strided_batches` gives, cut straight from the order's runs of indices.

        The hot path of every prepared map-style loader: this process's slice
        of each window of N batches is copied in C, instead of the Python
        loop of torch's BatchSampler building every process's batches.
        """
        # A seekable order comes with a BatchSampler, which has a batch size.
        n, r, size = self.num_processes, self.process_index, cast(int, self.batch_size)
        window = n * size
        epoch_start: list[int] = [i for b in self._epoch_start(n) for i in b] if seeked else []
        pending: list[int] = []
        for chunk in order.index_chunks():
            pending.extend(chunk)
            whole = len(pending) - len(pending) % window
            if whole and not epoch_start:  # the pass's first window (a seeked pass computed it above)
                epoch_start = pending[:window]
            for offset in range(0, whole, window):
                yield pending[offset + r * size:offset + (r + 1) * size]
            del pending[:whole]
        if not pending or self.drop_last:  # BatchSampler(drop_last=True) dropped the short batch; the rest too
            return
        if not self.even_batches:
            if r * size < len(pending):
                yield pending[r * size:(r + 1) * size]
            return
        if not epoch_start:  # the whole epoch is shorter than one window
            epoch_start = list(pending)
        pending = _cycle_fill(pending, epoch_start, window - len(pending))
        yield pending[r * size:(r + 1) * size]

    def _iter_strided_batches(self, seeked: bool = False) -> Iterator[list[int]]:
        r = self.process_index
        for window in self._windows(self.num_processes, seeked):
            if r < len(window):  # (a short last window only without even_batches)
                yield window[r]

    def _windows(self, n: int, seeked: bool = False) -> Iterator[list[list[int]]]:
        """The inner batches in windows of `n`, as `n` processes take them: the last window completed from the
        epoch's first samples (even_batches), dropped (drop_last) or left short (neither)."""
        size = self.batch_size
        chunk: list[list[int]] = []
        # the first batches, to pad the last chunk with (computed when a seek skipped them)
        epoch_start: list[list[int]] = self._epoch_start(n) if seeked else []
        for batch in self.batch_sampler:
            batch = list(batch)
            if len(epoch_start) < n and not seeked:
                epoch_start.append(batch)
            chunk.append(batch)
            if len(chunk) == n and (size is None or len(batch) == size):
                yield chunk
                chunk = []
        if not chunk or self.drop_last:
            return
        if not self.even_batches:
            yield chunk
            return
        if size is None:  # batches of unknown size: pad with whole batches
            yield _cycle_fill(chunk, epoch_start, n - len(chunk))
            return
        flat = [i for b in chunk for i in b]
        flat = _cycle_fill(flat, [i for b in epoch_start for i in b], n * size - len(flat))
        yield [flat[k * size:(k + 1) * size] for k in range(n)]

    def _iter_split(self, seeked: bool = False) -> Iterator[list[int]]:
        n, r, size = self.num_processes, self.process_index, self.batch_size
        epoch_start: list[int] = next(iter(self._epoch_start(1)), []) if seeked else []
        for batch in self.batch_sampler:
            batch = list(batch)
            if not epoch_start:
                epoch_start = batch
            full = size if size is not None else len(batch)
            if len(batch) < full and self.even_batches:
                batch = _cycle_fill(batch, epoch_start, full - len(batch))
            if size is None:
                start, end = share_bounds(len(batch), r, n)
            else:  # fixed parts of batch_size // n: a short last batch (even_batches=False) leaves the last ones out
                start, end = r * (size // n), min(len(batch), (r + 1) * (size // n))
            if end > start:
                yield batch[start:end]


class SkipBatchSampler(BatchSampler):
    """An inner batch sampler without its first `skip_batches` batches (used to resume mid-epoch).

    A `BatchSampler`, as Accelerate's, so a loader given it as its sampler is
    still seen as batching; other attributes (`batch_size`, `sampler`, ...)
    are the inner batch sampler's.

    Example:
        >>> list(SkipBatchSampler([[0], [1], [2]], skip_batches=2))
        [[2]]
    """

    def __init__(self, batch_sampler: Iterable[list[int]], skip_batches: int = 0) -> None:
        self.batch_sampler = batch_sampler
        self.skip_batches = skip_batches

    def __iter__(self) -> Iterator[list[int]]:
        return itertools.islice(iter(self.batch_sampler), self.skip_batches, None)

    @property
    def total_length(self) -> int:
        """The inner batch sampler's length (skipped batches included)."""
        return len(self.batch_sampler)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return max(0, len(self.batch_sampler) - self.skip_batches)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "batch_sampler":  # not yet set (during unpickling)
            raise AttributeError(name)
        return getattr(self.batch_sampler, name)


class IterableDatasetShard(IterableDataset):
    """This process's items of an iterable dataset, read in groups of one global batch (Accelerate's layout).

    Each process reads the whole stream; of every `batch_size * num_processes`
    items (`batch_size` with `split_batches`) it keeps its contiguous part.
    Unless `drop_last`, a short last group is completed with the stream's
    first items, so every process yields the same number of batches.

    Example:
        >>> list(IterableDatasetShard(range(7), batch_size=2, num_processes=2, process_index=1))
        [2, 3, 6, 0]
    """

    def __init__(
        self,
        dataset: Iterable[Any],
        batch_size: int = 1,
        drop_last: bool = False,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
    ) -> None:
        if split_batches and batch_size > 1 and batch_size % num_processes:
            raise ValueError(
                f"split_batches=True needs the DataLoader's batch_size ({batch_size}) to be a multiple of "
                f"the number of processes ({num_processes})."
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    @property
    def per_process(self) -> int:
        return self.batch_size // self.num_processes if self.split_batches else self.batch_size

    @property
    def window(self) -> int:
        """Items read per global batch."""
        return self.batch_size if self.split_batches else self.batch_size * self.num_processes

    def __len__(self) -> int:
        """Items this process yields per pass, as Accelerate counts them (needs a dataset with a length)."""
        total = len(self.dataset)  # type: ignore[arg-type] # TypeError for unsized streams, like torch's
        groups = total // (self.batch_size * self.num_processes) if self.drop_last else \
            -(-total // (self.batch_size * self.num_processes))
        return groups * self.batch_size

    def __iter__(self) -> Iterator[Any]:
        generator = getattr(self.dataset, "generator", None)
        if not hasattr(self.dataset, "set_epoch") and isinstance(generator, torch.Generator):
            generator.manual_seed(self.epoch)  # a dataset shuffling with its own generator: one stream per epoch
        window = self.window
        start, end = self.process_index * self.per_process, (self.process_index + 1) * self.per_process
        first: list[Any] = []
        buffer: list[Any] = []
        for item in self.dataset:
            buffer.append(item)
            if len(buffer) == window:
                if not first:
                    first = list(buffer)
                yield from buffer[start:end]
                buffer = []
        if not buffer or self.drop_last:
            return
        buffer = _cycle_fill(buffer, first or list(buffer), window - len(buffer))
        yield from buffer[start:end]
