"""Starting a loader after its first batches: `skip_first_batches` and Accelerate's `SkipDataLoader`.

A view of a prepared loader seeks: the skipped batches are neither loaded
nor (over hasten's order) drawn, and the view shares the loader's epoch and
position. A plain torch loader becomes what Accelerate makes of it: a torch
`DataLoader` whose batch sampler skips (indices drawn, nothing loaded), or,
over an iterable dataset, a `SkipDataLoader` (the stream is read and the
skipped batches dropped); `prepare` then prepares it as any other loader.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from .loader import PreparedDataLoader, loader_kwargs
from .sharding import SkipBatchSampler

__all__ = ["SkipDataLoader", "skip_first_batches"]


class SkipDataLoader(PreparedDataLoader):
    """A loader that leaves out the first `skip_batches` batches of every pass (Accelerate's `SkipDataLoader`).

    It takes a torch DataLoader's arguments, plus `skip_batches` and
    `use_stateful_dataloader`; like Accelerate's, it puts nothing on a device
    and tells no sampler the epoch. `prepare` treats it as a loader still to
    prepare.

    Example:
        >>> [b.tolist() for b in SkipDataLoader(list(range(8)), batch_size=2, skip_batches=3)]
        [[6, 7]]
    """

    def __init__(self, dataset: Any, skip_batches: int = 0, use_stateful_dataloader: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(dataset, skip_batches=skip_batches, use_stateful_dataloader=use_stateful_dataloader, **kwargs)

    def default_epoch_targets(self) -> tuple[Any, ...]:
        return ()


def skip_first_batches(dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
    """A loader like `dataloader` that starts after its first `num_batches` batches (for a mid-epoch resume).

    Skipped batches are never loaded: for a prepared loader over a map-style
    dataset the order seeks straight to the first kept batch. A view of a
    prepared loader shares its epoch and position, so after a full pass over
    the view the original continues with the next epoch. A torch loader
    gives a torch loader (a `SkipDataLoader` over an iterable dataset), as
    Accelerate's does.

    Example:
        >>> dl = DataLoader(list(range(6)), batch_size=2)
        >>> [b.tolist() for b in skip_first_batches(dl, 2)]
        [[4, 5]]
    """
    if num_batches < 0:
        raise ValueError(f"num_batches must be >= 0, got {num_batches}.")
    if isinstance(dataloader, PreparedDataLoader):
        return _view(dataloader, num_batches)
    kwargs = loader_kwargs(dataloader)
    if isinstance(dataloader.dataset, IterableDataset):
        return SkipDataLoader(dataloader.dataset, skip_batches=num_batches, batch_size=dataloader.batch_size,
                              drop_last=dataloader.drop_last, **kwargs)
    if isinstance(dataloader.sampler, BatchSampler):  # batches given as the sampler (batch_size=None or not)
        return DataLoader(dataloader.dataset, sampler=SkipBatchSampler(dataloader.sampler, num_batches),
                          batch_size=dataloader.batch_size, **kwargs)
    if dataloader.batch_sampler is None:  # no automatic batching: each index is a batch
        return SkipDataLoader(dataloader.dataset, skip_batches=num_batches, batch_size=None, sampler=dataloader.sampler,
                              **kwargs)
    batches = SkipBatchSampler(dataloader.batch_sampler, num_batches)
    return DataLoader(dataloader.dataset, batch_sampler=batches, **kwargs)


def _view(dataloader: PreparedDataLoader, num_batches: int) -> PreparedDataLoader:
    """A prepared loader sharing `dataloader`'s order and position, skipping `num_batches` more on every pass."""
    kwargs = {**loader_kwargs(dataloader), "device": dataloader.device, "gradient_state": dataloader.gradient_state,
              "order": dataloader.order, "cursor": dataloader.cursor, "global_batch_size": dataloader.global_batch_size,
              "skip_batches": dataloader.skip_batches + num_batches, "rng_types": dataloader.rng_types,
              "synchronized_generator": dataloader.synchronized_generator, "source_drop_last": dataloader._drop_last,
              "epoch_targets": dataloader._epoch_targets, "non_blocking": dataloader._non_blocking,
              "torch_device_mesh": dataloader.torch_device_mesh, **dataloader.view_kwargs()}  # (no torchdata state: Accelerate's views are plain loaders too)
    view = getattr(type(dataloader), "_made_from", type(dataloader))  # the loader's class, not its torchdata variant
    if dataloader.batch_sampler is None:
        return view(dataloader.dataset, batch_size=dataloader.batch_size, drop_last=dataloader.drop_last,
                    sampler=dataloader.sampler if isinstance(dataloader.sampler, BatchSampler) else None, **kwargs)
    return view(dataloader.dataset, batch_sampler=dataloader.batch_sampler, **kwargs)
