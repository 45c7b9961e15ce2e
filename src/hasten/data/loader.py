"""The prepared DataLoader: this process's batches, on its device, with its position as state.

`prepare_data_loader` replaces the loader's sampler by a `SampleOrder`
(see `order.py`) and shards the batches (see `sharding.py`). The loader's
position — epoch, batches handed out in the current pass, the shuffle's
seed or generator state — lives in a `LoaderCursor` that checkpoints save
and restore. A resume at batch k seeks the order to k: nothing is drawn or
loaded for the skipped batches.
"""

from __future__ import annotations

import functools
import itertools
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler
from torch.utils.data.distributed import DistributedSampler

from ..collectives import send_to_device
from ..gradient_state import GradientState, LoaderPosition
from .order import SampleOrder
from .sharding import IterableDatasetShard, ShardedBatchSampler, SkipBatchSampler, seek_batches

__all__ = ["LoaderCursor", "PreparedDataLoader", "prepare_data_loader", "skip_first_batches"]


@dataclass
class LoaderCursor:
    """Where a prepared loader is; shared with the `skip_first_batches` views made from it.

    Example:
        >>> LoaderCursor(epoch=2, yielded=5)
        LoaderCursor(epoch=2, yielded=5, pending_skip=0, training=False)
    """

    epoch: int = 0
    yielded: int = 0  # batches handed out in the current pass (the look-ahead batch does not count)
    pending_skip: int = 0  # batches the next pass skips: a restored position
    training: bool = False  # backward() consumed this loader's batches: its boundaries are preemption points


class PreparedDataLoader(DataLoader):
    """A DataLoader that yields this process's batches on its device and tells the Accelerator where it is.

    It looks one batch ahead so that, while the last batch is being used,
    `end_of_dataloader` is already true (gradient accumulation then syncs,
    `gather_for_metrics` drops padding). `len()` is this process's number
    of batches. `epoch` is the pass the next iteration runs; `set_epoch(e)`
    picks it (and with it the shuffle); otherwise each full pass advances it.
    `state_dict()` / `load_state_dict()` save and restore the position.

    Example:
        >>> loader = prepare_data_loader(DataLoader(list(range(6)), batch_size=2), torch.device("cpu"))
        >>> [b.tolist() for b in loader]
        [[0, 1], [2, 3], [4, 5]]
        >>> loader.epoch
        1
    """

    def __init__(
        self,
        *args: Any,
        device: torch.device | None = None,
        gradient_state: GradientState | None = None,
        padded_remainder: int = 0,
        skip_batches: int = 0,
        order: SampleOrder | None = None,
        cursor: LoaderCursor | None = None,
        global_batch_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.device = device
        self.gradient_state = gradient_state
        self.padded_remainder = padded_remainder
        self.skip_batches = skip_batches  # a skip_first_batches view skips these on every pass
        self.order = order
        self.cursor = cursor if cursor is not None else LoaderCursor()
        self.global_batch_size = global_batch_size
        # Decided once: on CPU the batches are already where they belong.
        self._move_batches = device is not None and device.type != "cpu"

    # -- epochs -------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self.cursor.epoch

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self.cursor.epoch = epoch

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose shuffle the next iteration uses (same on every process).

        A position restored by `load_state` for this same epoch is kept; for
        another epoch it is dropped.
        """
        if epoch != self.cursor.epoch:
            self.cursor.pending_skip = 0
        self.cursor.epoch = epoch

    def _apply_epoch(self) -> None:
        # Walk the chain of (batch) samplers down to the sampler, plus the dataset.
        epoch = self.cursor.epoch
        pending, seen = [self.batch_sampler, self.dataset], set()
        while pending:
            holder = pending.pop()
            if holder is None or id(holder) in seen:
                continue
            seen.add(id(holder))
            if hasattr(holder, "set_epoch"):
                holder.set_epoch(epoch)
            pending += [vars(holder).get("batch_sampler"), vars(holder).get("sampler")] if hasattr(holder, "__dict__") else []
        if self.order is not None and self.order.kind == "torch":
            # torch draws its per-pass base seed from the loader's generator: give it the epoch's state.
            self.generator.set_state(self.order.epoch_start_state(epoch))

    def __len__(self) -> int:
        return max(0, super().__len__() - self.skip_batches)

    # -- iteration ------------------------------------------------------------------------
    def _start_pass(self, skip: int) -> Iterator[Any]:
        seeked = skip > 0 and self.batch_sampler is not None and seek_batches(self.batch_sampler, skip)
        if not skip:
            return super().__iter__()
        # This pass continues one that began before a checkpoint, and that pass already drew the
        # DataLoader's base seed from the global RNG: drawing again would shift every later random number.
        rng_state = torch.get_rng_state()
        iterator = super().__iter__()
        torch.set_rng_state(rng_state)
        return iterator if seeked else itertools.islice(iterator, skip, None)

    def __iter__(self) -> Iterator[Any]:
        cursor, state = self.cursor, self.gradient_state
        if state is not None and state.boundary_hook is not None and cursor.training:
            state.boundary_hook(self)  # asked for the first batch: a preemption point
        skip = cursor.pending_skip + self.skip_batches
        self._apply_epoch()
        position = LoaderPosition(remainder=self.padded_remainder, cursor=cursor, loader=self)
        if state is not None:
            state.push(position)
        try:
            iterator = self._start_pass(skip)
            cursor.pending_skip, cursor.yielded = 0, skip
            sentinel = object()
            current = next(iterator, sentinel)
            while current is not sentinel:
                following = next(iterator, sentinel)
                if following is sentinel:
                    position.end_of_dataloader = True
                    position.remainder = self.final_remainder()
                cursor.yielded += 1
                yield send_to_device(current, self.device, non_blocking=True) if self._move_batches else current
                # read each time: the hook removes itself once it has nothing left to do
                if state is not None and state.boundary_hook is not None and cursor.training:
                    state.boundary_hook(self)  # asked for the next batch: a preemption point
                current = following
            cursor.epoch, cursor.yielded = cursor.epoch + 1, 0
        except GeneratorExit:  # the loop broke off: the next pass starts this epoch again from its start
            cursor.yielded = 0
            raise
        finally:
            if state is not None:
                state.pop(position)

    def final_remainder(self) -> int:
        """Real samples in the last global batch when it is padded, else 0 (read when that batch is reached)."""
        return self.padded_remainder

    def view_kwargs(self) -> dict[str, Any]:
        """Constructor arguments of a subclass that `skip_first_batches` passes on to a view."""
        return {}

    # -- position as state --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The loader's position: epoch, batches handed out in this pass, shuffle state, batch geometry.

        Example:
            >>> loader = prepare_data_loader(DataLoader(list(range(6)), batch_size=2), torch.device("cpu"))
            >>> loader.state_dict()["epoch"], loader.state_dict()["yielded"]
            (0, 0)
        """
        return {
            "epoch": self.cursor.epoch,
            # outside a pass, a restored position not yet used is still the position
            "yielded": self.cursor.yielded or self.cursor.pending_skip,
            "global_batch_size": self.global_batch_size,
            "num_batches": super().__len__() if self._sized() else None,
            "order": None if self.order is None else self.order.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any], restore_position: bool = True) -> None:
        """Restore the shuffle state and epoch; with `restore_position`, the next pass resumes after the saved batch.

        A position saved with another global batch size (another number of
        processes) resumes on the same global sample order when it falls on
        a whole number of the new global batches; otherwise one clear error.
        """
        skip = self.batches_to_skip(state) if restore_position else 0
        if self.order is not None and state.get("order") is not None:
            self.order.load_state_dict(state["order"])
        self.cursor.epoch = int(state["epoch"])
        self.cursor.yielded = 0
        self.cursor.pending_skip = skip

    def batches_to_skip(self, state: dict[str, Any]) -> int:
        """How many of this loader's batches a restored position skips (validated, nothing changed)."""
        yielded = int(state["yielded"])
        saved, now = state.get("global_batch_size"), self.global_batch_size
        if not yielded or saved == now:
            return yielded
        samples = yielded * saved if saved else None
        if samples is None or not now or samples % now:
            raise ValueError(
                f"the checkpoint stopped {yielded} batches of {saved} samples into epoch {state['epoch']}, which is not "
                f"a whole number of this run's global batches of {now}; resume with a global batch size "
                f"(batch size x processes) that divides {samples}, or from a checkpoint saved at an epoch's end."
            )
        return samples // now

    def _sized(self) -> bool:
        try:
            super().__len__()
        except TypeError:
            return False
        return True


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


def _rank0_value(value: Any, num_processes: int) -> Any:
    """Rank 0's `value` on every process (one collective; works on gloo and nccl)."""
    if num_processes > 1:
        import torch.distributed as dist

        holder = [value]
        dist.broadcast_object_list(holder, src=0)
        value = holder[0]
    return value


def _sample_order(loader: DataLoader, sampler: Any, num_processes: int, data_seed: int | None = None) -> SampleOrder | None:
    """A seekable `SampleOrder` for torch's stock samplers, agreed by every process; None for custom samplers."""
    if type(sampler) is SequentialSampler:
        return SampleOrder(len(sampler.data_source), kind="sequential")
    if type(sampler) is not RandomSampler:
        return None
    common = dict(num_items=len(sampler.data_source), replacement=sampler.replacement, num_samples=sampler._num_samples)
    if data_seed is not None:  # the user's seed decides, on every process alike
        return SampleOrder(kind="keyed", seed=int(data_seed), **common)
    if sampler.generator is not None and sampler.generator is loader.generator:
        # The user's generator decides the order: replay exactly what the unprepared loader would draw.
        state = _rank0_value(loader.generator.get_state(), num_processes)
        return SampleOrder(kind="torch", generator_state=state, **common)
    source = sampler.generator  # None: torch's global RNG, as RandomSampler does
    seed = int(torch.empty((), dtype=torch.int64).random_(generator=source).item())
    return SampleOrder(kind="keyed", seed=_rank0_value(seed, num_processes), **common)


def prepare_data_loader(
    dataloader: DataLoader,
    device: torch.device | None = None,
    num_processes: int = 1,
    process_index: int = 0,
    split_batches: bool = False,
    even_batches: bool = True,
    gradient_state: GradientState | None = None,
    device_placement: bool = True,
    data_seed: int | None = None,
    dispatch_batches: bool = False,
    slice_fn_for_dispatch: Callable[..., Any] | None = None,
) -> PreparedDataLoader:
    """Return a loader that yields only this process's share of `dataloader`, on `device`.

    `data_seed` fixes the shuffle of a RandomSampler (the same on every process).
    `dispatch_batches=True`: process 0 alone reads `dataloader` and sends
    every process its rows (see `dispatch.py`); `slice_fn_for_dispatch(batch,
    rows: slice, process_index=, num_processes=)` replaces the row slicing.

    Example:
        >>> dl = DataLoader(list(range(8)), batch_size=2)
        >>> [b.tolist() for b in prepare_data_loader(dl, num_processes=2, process_index=0)]
        [[0, 1], [4, 5]]
    """
    if isinstance(dataloader, PreparedDataLoader):
        raise ValueError("this DataLoader is already prepared; pass the original DataLoader to prepare once.")
    if slice_fn_for_dispatch is not None and not dispatch_batches:
        raise ValueError("slice_fn_for_dispatch only applies with dispatch_batches=True; set both or drop it.")
    if dispatch_batches:  # process 0 reads the whole loader; the dispatcher splits each global batch
        from .dispatch import DispatchedDataLoader

        per_dispatch = 1 if split_batches else num_processes
        dispatcher = functools.partial(DispatchedDataLoader, num_processes=num_processes, process_index=process_index,
                                       batches_per_dispatch=per_dispatch, even_batches=even_batches,
                                       slice_fn=slice_fn_for_dispatch)
        loader = _build(dataloader, device, 1, 0, False, even_batches, gradient_state, device_placement, data_seed,
                        make=dispatcher)
        if loader.global_batch_size is not None:
            loader.global_batch_size *= per_dispatch
        return loader
    return _build(dataloader, device, num_processes, process_index, split_batches, even_batches, gradient_state,
                  device_placement, data_seed, make=PreparedDataLoader)


def _build(dataloader: DataLoader, device: torch.device | None, num_processes: int, process_index: int,
           split_batches: bool, even_batches: bool, gradient_state: GradientState | None, device_placement: bool,
           data_seed: int | None, make: Callable[..., PreparedDataLoader]) -> PreparedDataLoader:
    """The prepared loader of `num_processes` ranks, made by `make` (PreparedDataLoader or the dispatcher)."""
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
        return make(
            dataset, batch_size=per_process, drop_last=dataloader.drop_last, padded_remainder=padded_remainder,
            global_batch_size=per_process * num_processes, **common
        )

    if dataloader.batch_sampler is None and isinstance(dataloader.sampler, BatchSampler):
        # batch_size=None over a BatchSampler: each item is a list of indices the dataset fetches at once.
        pre_batched: Any = dataloader.sampler
        padded_remainder = 0
        if num_processes > 1:
            pre_batched = ShardedBatchSampler(pre_batched, num_processes, process_index, split_batches, even_batches)
            padded_remainder = pre_batched.padded_remainder
        size = dataloader.sampler.batch_size
        return make(dataset, batch_size=None, sampler=pre_batched, padded_remainder=padded_remainder,
                                  global_batch_size=size if split_batches else size * num_processes, **common)
    if dataloader.batch_sampler is None:
        raise ValueError(
            "prepare needs a DataLoader with automatic batching; set batch_size (or batch_sampler) on it, "
            "or give it a BatchSampler as sampler with batch_size=None."
        )
    batch_sampler = dataloader.batch_sampler
    sampler = getattr(batch_sampler, "sampler", None)
    if isinstance(sampler, DistributedSampler):
        warnings.warn(
            "the DataLoader already uses a DistributedSampler, so hasten does not shard it again; "
            "drop the DistributedSampler to get hasten's sharding, even batches and gather_for_metrics.",
            stacklevel=3,
        )
        return make(dataset, batch_sampler=batch_sampler, **common)
    order = _sample_order(dataloader, sampler, num_processes, data_seed) if type(batch_sampler) is BatchSampler else None
    if order is not None:
        batch_sampler = BatchSampler(order, batch_sampler.batch_size, batch_sampler.drop_last)
        if order.kind == "torch":
            common["generator"] = torch.Generator()  # private: set to each epoch's state before a pass
    padded_remainder = 0
    if num_processes > 1:
        batch_sampler = ShardedBatchSampler(batch_sampler, num_processes, process_index, split_batches, even_batches)
        padded_remainder = batch_sampler.padded_remainder
    size = getattr(dataloader.batch_sampler, "batch_size", None)
    global_batch = None if size is None else (size if split_batches else size * num_processes)
    return make(dataset, batch_sampler=batch_sampler, padded_remainder=padded_remainder, order=order,
                              global_batch_size=global_batch, **common)


def skip_first_batches(dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
    """A loader like `dataloader` that starts after its first `num_batches` batches (for a mid-epoch resume).

    Skipped batches are neither loaded nor drawn: for a prepared loader
    over a map-style dataset the order seeks straight to the first kept
    batch. A view of a prepared loader shares its epoch and position, so
    after a full pass over the view the original continues with the next
    epoch.

    Example:
        >>> dl = DataLoader(list(range(6)), batch_size=2)
        >>> [b.tolist() for b in skip_first_batches(dl, 2)]
        [[4, 5]]
    """
    if num_batches < 0:
        raise ValueError(f"num_batches must be >= 0, got {num_batches}.")
    if isinstance(dataloader, PreparedDataLoader):
        kwargs = {**_loader_kwargs(dataloader), "device": dataloader.device, "gradient_state": dataloader.gradient_state,
                  "padded_remainder": dataloader.padded_remainder, "order": dataloader.order,
                  "cursor": dataloader.cursor, "global_batch_size": dataloader.global_batch_size,
                  "skip_batches": dataloader.skip_batches + num_batches, **dataloader.view_kwargs()}
        view = type(dataloader)
        if dataloader.batch_sampler is None:
            return view(dataloader.dataset, batch_size=dataloader.batch_size, drop_last=dataloader.drop_last, **kwargs)
        return view(dataloader.dataset, batch_sampler=dataloader.batch_sampler, **kwargs)
    kwargs = _loader_kwargs(dataloader)
    if dataloader.batch_sampler is None or isinstance(dataloader.dataset, IterableDataset):
        return PreparedDataLoader(dataloader.dataset, batch_size=dataloader.batch_size, drop_last=dataloader.drop_last,
                                  skip_batches=num_batches, **kwargs)
    return PreparedDataLoader(dataloader.dataset, batch_sampler=SkipBatchSampler(dataloader.batch_sampler, num_batches),
                              **kwargs)
