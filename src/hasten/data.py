"""Data loader sharding across processes, epoch-consistent shuffling, device transfer.

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
import warnings
from typing import Any, Iterable, Iterator

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, Sampler
from torch.utils.data.distributed import DistributedSampler

from .collectives import send_to_device, share_bounds
from .gradient_state import GradientState, LoaderPosition

__all__ = [
    "ShardedBatchSampler",
    "SkipBatchSampler",
    "EpochSeededRandomSampler",
    "IterableDatasetShard",
    "PreparedDataLoader",
    "prepare_data_loader",
    "skip_first_batches",
]


class EpochSeededRandomSampler(Sampler[int]):
    """A RandomSampler whose order is a function of (seed, epoch) only.

    Every process computes the same permutation for the same epoch, and a
    new one for the next epoch, without communicating.

    Example:
        >>> sampler = EpochSeededRandomSampler(range(5), seed=0)
        >>> first = list(sampler); sampler.set_epoch(1)
        >>> sorted(first) == sorted(sampler) == list(range(5))
        True
    """

    def __init__(self, data_source: Any, seed: int, replacement: bool = False, num_samples: int | None = None) -> None:
        self.data_source = data_source
        self.seed = int(seed)
        self.replacement = replacement
        self._num_samples = num_samples
        self.epoch = 0

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        n = len(self.data_source)
        if self.replacement:
            yield from torch.randint(n, (self.num_samples,), generator=generator).tolist()
            return
        order: list[int] = []
        while len(order) < self.num_samples:
            order.extend(torch.randperm(n, generator=generator).tolist())
        yield from order[: self.num_samples]


def _cycle_fill(indices: list[Any], source: list[Any], count: int) -> list[Any]:
    """`indices` extended with `count` items taken cyclically from `source`."""
    if count <= 0:
        return indices
    return indices + list(itertools.islice(itertools.cycle(source), count))


class ShardedBatchSampler(Sampler[list[int]]):
    """This process's batches of an inner batch sampler.

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
    ) -> None:
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.batch_size: int | None = getattr(batch_sampler, "batch_size", None)
        self.drop_last: bool = bool(getattr(batch_sampler, "drop_last", False))
        if split_batches and self.batch_size is not None and self.batch_size % num_processes:
            raise ValueError(
                f"split_batches=True needs the DataLoader's batch_size ({self.batch_size}) to be a multiple of "
                f"the number of processes ({num_processes}); change the batch size or use split_batches=False."
            )

    @property
    def sampler(self) -> Any:
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

    def __len__(self) -> int:
        inner = len(self.batch_sampler)  # type: ignore[arg-type]
        n, r = self.num_processes, self.process_index
        if self.split_batches:
            if self.even_batches or self.drop_last or self.batch_size is None:
                return inner
            total = self.total_samples
            last = 0 if total is None else total % self.batch_size
            start, end = share_bounds(last, r, n)
            return inner - 1 if last and start == end else inner
        if self.drop_last:
            return inner // n
        if self.even_batches:
            return -(-inner // n)
        return inner // n + (1 if r < inner % n else 0)

    def __iter__(self) -> Iterator[list[int]]:
        if self.split_batches:
            return self._iter_split()
        return self._iter_strided()

    def _iter_strided(self) -> Iterator[list[int]]:
        n, r, size = self.num_processes, self.process_index, self.batch_size
        chunk: list[list[int]] = []
        epoch_start: list[list[int]] = []  # the first batches, to pad the last chunk with
        for batch in self.batch_sampler:
            batch = list(batch)
            if len(epoch_start) < n:
                epoch_start.append(batch)
            chunk.append(batch)
            if len(chunk) == n and (size is None or len(batch) == size):
                yield chunk[r]
                chunk = []
        if not chunk or self.drop_last:
            return
        if not self.even_batches:
            if r < len(chunk):
                yield chunk[r]
            return
        if size is None:  # batches of unknown size: pad with whole batches
            chunk = _cycle_fill(chunk, epoch_start, n - len(chunk))
            yield chunk[r]
            return
        flat = [i for b in chunk for i in b]
        flat = _cycle_fill(flat, [i for b in epoch_start for i in b], n * size - len(flat))
        yield flat[r * size : (r + 1) * size]

    def _iter_split(self) -> Iterator[list[int]]:
        n, r, size = self.num_processes, self.process_index, self.batch_size
        epoch_start: list[int] = []
        for batch in self.batch_sampler:
            batch = list(batch)
            if not epoch_start:
                epoch_start = batch
            full = size if size is not None else len(batch)
            if len(batch) < full and self.even_batches:
                batch = _cycle_fill(batch, epoch_start, full - len(batch))
            if len(batch) % n == 0:
                share = len(batch) // n
                yield batch[r * share : (r + 1) * share]
            else:
                start, end = share_bounds(len(batch), r, n)
                if end > start:
                    yield batch[start:end]


class SkipBatchSampler(Sampler[list[int]]):
    """An inner batch sampler without its first `skip_batches` batches (used to resume mid-epoch).

    Example:
        >>> list(SkipBatchSampler([[0], [1], [2]], skip_batches=2))
        [[2]]
    """

    def __init__(self, batch_sampler: Iterable[list[int]], skip_batches: int) -> None:
        self.batch_sampler = batch_sampler
        self.skip_batches = skip_batches

    def __iter__(self) -> Iterator[list[int]]:
        return itertools.islice(iter(self.batch_sampler), self.skip_batches, None)

    def __len__(self) -> int:
        return max(0, len(self.batch_sampler) - self.skip_batches)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "batch_sampler":  # not yet set (during unpickling)
            raise AttributeError(name)
        return getattr(self.batch_sampler, name)


class IterableDatasetShard(IterableDataset):
    """This process's items of an iterable dataset, read in groups of one global batch.

    Example:
        >>> list(IterableDatasetShard(range(7), batch_size=2, num_processes=2, process_index=1))
        [2, 3, 6, 0]
    """

    def __init__(
        self,
        dataset: Iterable[Any],
        batch_size: int,
        num_processes: int,
        process_index: int,
        split_batches: bool = False,
        even_batches: bool = True,
        drop_last: bool = False,
    ) -> None:
        if split_batches and batch_size % num_processes:
            raise ValueError(
                f"split_batches=True needs the DataLoader's batch_size ({batch_size}) to be a multiple of "
                f"the number of processes ({num_processes})."
            )
        self.dataset = dataset
        self.per_process = batch_size // num_processes if split_batches else batch_size
        self.num_processes = num_processes
        self.process_index = process_index
        self.even_batches = even_batches
        self.drop_last = drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    @property
    def window(self) -> int:
        """Items read per global batch."""
        return self.per_process * self.num_processes

    @property
    def padded_remainder(self) -> int:
        """Real items in the padded last global batch (0 when unsized or not padded)."""
        if not self.even_batches or self.drop_last or not hasattr(self.dataset, "__len__"):
            return 0
        return len(self.dataset) % self.window  # type: ignore[arg-type]

    def __len__(self) -> int:
        """Items this process yields per pass; only for datasets that have a length."""
        total = len(self.dataset)  # type: ignore[arg-type] # TypeError for unsized streams, like torch's
        full, remaining = divmod(total, self.window)
        if self.drop_last or not remaining:
            return full * self.per_process
        if self.even_batches:
            return (full + 1) * self.per_process
        start = self.process_index * self.per_process
        return full * self.per_process + min(self.per_process, max(0, remaining - start))

    def __iter__(self) -> Iterator[Any]:
        window = self.per_process * self.num_processes
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
        if self.even_batches:
            buffer = _cycle_fill(buffer, first or list(buffer), window - len(buffer))
            yield from buffer[start:end]
        else:
            yield from buffer[start:end]


class PreparedDataLoader(DataLoader):
    """A DataLoader that yields this process's batches on its device and tells the Accelerator where it is.

    It looks one batch ahead so that, while the last batch is being used,
    `end_of_dataloader` is already true (gradient accumulation then syncs,
    `gather_for_metrics` drops padding). `len()` is this process's number
    of batches. Call `set_epoch(e)` to pick the epoch's shuffle explicitly;
    otherwise each full pass advances it.

    Example:
        >>> loader = prepare_data_loader(DataLoader(list(range(6)), batch_size=2), torch.device("cpu"))
        >>> [b.tolist() for b in loader]
        [[0, 1], [2, 3], [4, 5]]
    """

    def __init__(
        self,
        *args: Any,
        device: torch.device | None = None,
        gradient_state: GradientState | None = None,
        padded_remainder: int = 0,
        skip_batches: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.device = device
        self.gradient_state = gradient_state
        self.padded_remainder = padded_remainder
        self.skip_batches = skip_batches  # only for iterable datasets (map-style skip in the sampler)
        self.epoch = 0
        # Decided once: on CPU the batches are already where they belong.
        self._move_batches = device is not None and device.type != "cpu"

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose shuffle the next iteration uses (same on every process)."""
        self.epoch = epoch

    def _apply_epoch(self) -> None:
        # Walk the chain of (batch) samplers down to the sampler, plus the dataset.
        pending, seen = [self.batch_sampler, self.dataset], set()
        while pending:
            holder = pending.pop()
            if holder is None or id(holder) in seen:
                continue
            seen.add(id(holder))
            if hasattr(holder, "set_epoch"):
                holder.set_epoch(self.epoch)
            pending += [vars(holder).get("batch_sampler"), vars(holder).get("sampler")] if hasattr(holder, "__dict__") else []

    def __iter__(self) -> Iterator[Any]:
        self._apply_epoch()
        position = LoaderPosition(remainder=self.padded_remainder)
        state = self.gradient_state
        if state is not None:
            state.push(position)
        try:
            iterator = super().__iter__()
            if self.skip_batches and self.batch_sampler is None:
                iterator = itertools.islice(iterator, self.skip_batches, None)
            sentinel = object()
            current = next(iterator, sentinel)
            while current is not sentinel:
                following = next(iterator, sentinel)
                if following is sentinel:
                    position.end_of_dataloader = True
                yield send_to_device(current, self.device, non_blocking=True) if self._move_batches else current
                current = following
            self.epoch += 1
        finally:
            if state is not None:
                state.pop(position)


def _loader_kwargs(loader: DataLoader) -> dict[str, Any]:
    """The construction arguments of a DataLoader that do not concern batching."""
    kwargs = dict(
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        persistent_workers=loader.persistent_workers,
        pin_memory_device=getattr(loader, "pin_memory_device", ""),
    )
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    return kwargs


def _agreed_seed(loader: DataLoader, num_processes: int) -> int:
    """A shuffle seed every process agrees on: the loader's generator's, else drawn on rank 0 and broadcast."""
    if loader.generator is not None:
        seed = loader.generator.initial_seed()
    else:
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
    if num_processes > 1:
        import torch.distributed as dist

        holder = torch.tensor([seed], dtype=torch.int64)
        dist.broadcast(holder, src=0)
        seed = int(holder.item())
    return seed


def prepare_data_loader(
    dataloader: DataLoader,
    device: torch.device | None = None,
    num_processes: int = 1,
    process_index: int = 0,
    split_batches: bool = False,
    even_batches: bool = True,
    gradient_state: GradientState | None = None,
    device_placement: bool = True,
) -> PreparedDataLoader:
    """Return a loader that yields only this process's share of `dataloader`, on `device`.

    Example:
        >>> dl = DataLoader(list(range(8)), batch_size=2)
        >>> [b.tolist() for b in prepare_data_loader(dl, num_processes=2, process_index=0)]
        [[0, 1], [4, 5]]
    """
    if isinstance(dataloader, PreparedDataLoader):
        raise ValueError("this DataLoader is already prepared; pass the original DataLoader to prepare once.")
    common = dict(
        device=device if device_placement else None,
        gradient_state=gradient_state,
        **_loader_kwargs(dataloader),
    )
    dataset = dataloader.dataset
    if isinstance(dataset, IterableDataset):
        if dataloader.batch_size is None:
            raise ValueError("prepare needs a DataLoader with a batch_size for an iterable dataset.")
        padded_remainder = 0
        if num_processes > 1:
            dataset = IterableDatasetShard(
                dataset,
                batch_size=dataloader.batch_size,
                num_processes=num_processes,
                process_index=process_index,
                split_batches=split_batches,
                even_batches=even_batches,
                drop_last=dataloader.drop_last,
            )
            padded_remainder = dataset.padded_remainder
        per_process = dataloader.batch_size // num_processes if split_batches else dataloader.batch_size
        return PreparedDataLoader(
            dataset, batch_size=per_process, drop_last=dataloader.drop_last, padded_remainder=padded_remainder, **common
        )

    if dataloader.batch_sampler is None:
        raise ValueError(
            "prepare needs a DataLoader with automatic batching; set batch_size (or batch_sampler) on it."
        )
    batch_sampler = dataloader.batch_sampler
    sampler = getattr(batch_sampler, "sampler", None)
    if isinstance(sampler, DistributedSampler):
        warnings.warn(
            "the DataLoader already uses a DistributedSampler, so hasten does not shard it again; "
            "drop the DistributedSampler to get hasten's sharding, even batches and gather_for_metrics.",
            stacklevel=3,
        )
        return PreparedDataLoader(dataset, batch_sampler=batch_sampler, **common)
    if type(sampler) is RandomSampler:
        # The stock sampler draws a fresh seed from each process's own RNG:
        # processes would shuffle differently. Replace it with an agreed seed.
        seeded = EpochSeededRandomSampler(
            sampler.data_source,
            seed=_agreed_seed(dataloader, num_processes),
            replacement=sampler.replacement,
            num_samples=sampler._num_samples,
        )
        batch_sampler = BatchSampler(seeded, batch_sampler.batch_size, batch_sampler.drop_last)
    padded_remainder = 0
    if num_processes > 1:
        batch_sampler = ShardedBatchSampler(batch_sampler, num_processes, process_index, split_batches, even_batches)
        padded_remainder = batch_sampler.padded_remainder
    return PreparedDataLoader(dataset, batch_sampler=batch_sampler, padded_remainder=padded_remainder, **common)


def skip_first_batches(dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
    """A loader like `dataloader` that starts after its first `num_batches` batches (for a mid-epoch resume).

    Skipped batches are not loaded: for map-style datasets the skip happens
    in the batch sampler, before any sample is read.

    Example:
        >>> dl = DataLoader(list(range(6)), batch_size=2)
        >>> [b.tolist() for b in skip_first_batches(dl, 2)]
        [[4, 5]]
    """
    if num_batches < 0:
        raise ValueError(f"num_batches must be >= 0, got {num_batches}.")
    prepared = isinstance(dataloader, PreparedDataLoader)
    extra: dict[str, Any] = {}
    if prepared:
        extra = dict(
            device=dataloader.device,
            gradient_state=dataloader.gradient_state,
            padded_remainder=dataloader.padded_remainder,
        )
    kwargs = {**_loader_kwargs(dataloader), **extra}
    if dataloader.batch_sampler is None or isinstance(dataloader.dataset, IterableDataset):
        loader = PreparedDataLoader(
            dataloader.dataset,
            batch_size=dataloader.batch_size,
            drop_last=dataloader.drop_last,
            skip_batches=num_batches,
            **kwargs,
        )
    else:
        loader = PreparedDataLoader(
            dataloader.dataset, batch_sampler=SkipBatchSampler(dataloader.batch_sampler, num_batches), **kwargs
        )
    if prepared:
        loader.epoch = dataloader.epoch
    return loader
