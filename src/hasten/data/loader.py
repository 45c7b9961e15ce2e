"""The prepared DataLoader: this process's batches, on its device, with its position as state.

`prepare.py` builds it: a `SampleOrder` in place of a stock sampler and the
batches sharded (see `sharding.py`). The loader behaves as Accelerate's
prepared loader does wherever a script can tell: it looks one batch ahead
(so `end_of_dataloader` is true while the last batch is used), synchronises
the random number generators named by `rng_types` at the start of each pass,
tells the sampler (or dataset) the epoch, and knows the `remainder` of its
last global batch for `gather_for_metrics`.

Its position — epoch, batches handed out in the current pass, what replays
the pass's shuffle — lives in a `LoaderCursor` and the order's state, which
checkpoints save and restore (`position.py`: the cursor, the position as
state, Accelerate's `DataLoaderStateMixin`). A pass that continues a checkpointed one (a
resume at batch k, through `skip_first_batches` or a restored position)
draws nothing and loads nothing for the k skipped batches, so the resumed run
continues exactly where the interrupted one was.

With ``use_stateful_dataloader=True`` the loader is also a torchdata
`StatefulDataLoader` whose `state_dict` is torchdata's (see `stateful.py`);
hasten's checkpoints keep using `position_state`.
"""

from __future__ import annotations

import functools
from typing import Any, Iterator, cast

import torch
from torch.utils.data import BatchSampler, DataLoader

from ..runtime.collectives import send_to_device
from ..runtime.gradient_state import GradientState
from .elastic import ElasticBatchSampler
from .live import LivePosition, live_pass
from .order import SampleOrder
# the position half of the loader; DataLoaderStateMixin and LoaderCursor are also importable from here, as before
from .position import DataLoaderStateMixin, LoaderCursor, LoaderPositionMixin, skip_unread
from .sharding import can_seek_batches, seek_batches
from .stateful import stateful_variant, torchdata_available

__all__ = ["DataLoaderStateMixin", "LoaderCursor", "PreparedDataLoader", "get_sampler", "loader_kwargs"]


def loader_kwargs(loader: DataLoader) -> dict[str, Any]:
    """The construction arguments of a DataLoader that do not concern batching.

    Example:
        >>> loader_kwargs(DataLoader(range(4), batch_size=2))["num_workers"]
        0
    """
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
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    return kwargs


class _BaseLoader:
    """`base_dataloader`: Accelerate's loaders wrap a torch loader; a hasten loader is its own torch loader."""

    def __get__(self, loader: Any, owner: type) -> Any:
        if loader is None:  # as Accelerate's: an attribute of loader objects, not of the class
            raise AttributeError(f"base_dataloader is an attribute of {owner.__name__} objects, not of the class.")
        return loader


class PreparedDataLoader(DataLoaderStateMixin, LoaderPositionMixin, DataLoader):
    """A DataLoader that yields this process's batches on its device and tells the Accelerator where it is.

    `len()` is this process's number of batches. `epoch` (also `iteration`)
    is the pass the next iteration runs; `set_epoch(e)` picks it; otherwise
    each full pass advances it. `position_state()` / `load_position()` save
    and restore the position (also `state_dict()` / `load_state_dict()`
    unless the loader is a torchdata `StatefulDataLoader`, made with
    ``use_stateful_dataloader=True``, whose state they give then).
    `total_batch_size` is the global batch size, `remainder` the number of
    real samples in the last global batch (-1 when unknown), as in Accelerate.

    Accelerate's constructor arguments are taken too (``_drop_last``,
    ``_non_blocking``, ``iteration``, ``use_stateful_dataloader``,
    ``torch_device_mesh``), so it stands for Accelerate's `DataLoaderShard`.

    Example:
        >>> from hasten.data import prepare_data_loader
        >>> loader = prepare_data_loader(DataLoader(list(range(6)), batch_size=2), torch.device("cpu"))
        >>> [b.tolist() for b in loader]
        [[0, 1], [2, 3], [4, 5]]
        >>> loader.epoch
        1
    """

    use_stateful_dataloader = False
    base_dataloader = _BaseLoader()

    def __new__(cls, *args: Any, use_stateful_dataloader: bool = False, **kwargs: Any) -> PreparedDataLoader:
        if use_stateful_dataloader and not cls.use_stateful_dataloader and torchdata_available():
            cls = stateful_variant(cls)
        return super().__new__(cls)

    def __init__(
        self,
        dataset: Any,
        *args: Any,
        batch_sampler: Any = None,
        device: torch.device | None = None,
        gradient_state: GradientState | None = None,
        skip_batches: int = 0,
        order: SampleOrder | None = None,
        cursor: LoaderCursor | None = None,
        global_batch_size: int | None = None,
        rng_types: list[Any] | None = None,
        synchronized_generator: torch.Generator | None = None,
        source_drop_last: bool | None = None,
        epoch_targets: tuple[Any, ...] | None = None,
        non_blocking: bool | None = None,
        use_stateful_dataloader: bool = False,
        iteration: int = 0,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        torch_device_mesh: Any = None,
        **kwargs: Any,
    ) -> None:
        if self.use_stateful_dataloader and "in_order" in kwargs and not _takes_in_order():
            kwargs.pop("in_order")  # an older torchdata, as Accelerate does
        if batch_sampler is not None:  # named, as in Accelerate's DataLoaderAdapter(dataset, ..., batch_sampler=None)
            kwargs["batch_sampler"] = batch_sampler
        super().__init__(dataset, *args, **kwargs)
        self.device = device
        self.gradient_state = gradient_state if gradient_state is not None else GradientState()
        self.skip_batches = skip_batches  # a skip_first_batches view skips these on every pass
        self.order = order
        self.cursor = cursor if cursor is not None else LoaderCursor(epoch=iteration)
        self.global_batch_size = global_batch_size
        self.rng_types = list(rng_types) if rng_types else None
        self.synchronized_generator = synchronized_generator
        # the original loader's drop_last (Accelerate's `remainder` follows it)
        self._drop_last = _drop_last if source_drop_last is None else source_drop_last
        # objects told the epoch at each pass (the peer's set_epoch chain)
        self._epoch_targets = self.default_epoch_targets() if epoch_targets is None else epoch_targets
        self._non_blocking = _non_blocking if non_blocking is None else non_blocking
        self.torch_device_mesh = torch_device_mesh
        # Decided once: on CPU the batches are already where they belong.
        self._move_batches = device is not None and device.type != "cpu"
        self.end_of_dataloader = False
        self.remainder = -1
        # an elastic run's dealer of micro-batches (`elastic.py`), and the optimizer steps when it last handed one out
        batches = self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
        self._elastic = batches if isinstance(batches, ElasticBatchSampler) else None
        self._steps_at_handout = 0
        self._live = LivePosition()  # a live run's position
        self._healed: dict[str, Any] | None = None  # a live position received from a peer, for the next step
        self._built()

    def _built(self) -> None:
        """The loader is complete (a stateful one takes torchdata's first state here, see `stateful.py`)."""

    def default_epoch_targets(self) -> tuple[Any, ...]:
        """Who hears the epoch when the loader is built directly (not by `prepare`): Accelerate's `set_epoch` chain.

        The batch sampler, its sampler, and its inner batch sampler's sampler
        (else the dataset), each when it has `set_epoch`.
        """
        batches = self.batch_sampler
        inner = getattr(getattr(batches, "batch_sampler", None), "sampler", None)
        chain = [batches, getattr(batches, "sampler", None), inner if _takes_epoch(inner) else self.dataset]
        return _unique(chain)

    # -- epochs -------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self.cursor.epoch

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self.cursor.epoch = epoch

    iteration = epoch  # Accelerate's name for the number of completed passes

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next iteration runs (same on every process); the samplers hear it at once.

        A position restored by `load_state` for this same epoch is kept; for
        another epoch it is dropped.
        """
        if epoch != self.cursor.epoch:
            self.cursor.pending_skip = self.cursor.yielded = 0
            self.cursor.resumed = False
        self.cursor.epoch = epoch
        for target in self._epoch_targets:  # as Accelerate's set_epoch (the order hears it when the pass starts)
            target.set_epoch(epoch)

    def _apply_epoch(self) -> None:
        epoch = self.cursor.epoch
        if self.order is not None:
            self.order.set_epoch(epoch)
        for target in self._epoch_targets:
            target.set_epoch(epoch)

    def __len__(self) -> int:
        return max(0, super().__len__() - self.skip_batches)

    # -- Accelerate's loader attributes ---------------------------------------------------
    @property
    def total_batch_size(self) -> int:
        """Samples per step over all processes (the batch size times the processes, or the batch size when split)."""
        batches = self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
        size = batches.batch_size  # type: ignore[union-attr]
        return size if getattr(batches, "split_batches", False) else size * getattr(batches, "num_processes", 1)

    @property
    def total_dataset_length(self) -> int:
        dataset = self.dataset
        return dataset.total_length if hasattr(dataset, "total_length") else len(dataset)  # type: ignore[arg-type]

    def get_sampler(self) -> Any:
        """The sampler under the batch sampler (the `SampleOrder` when prepare replaced a stock one)."""
        return get_sampler(self)

    def set_sampler(self, sampler: Any) -> None:
        """Put `sampler` under the batch sampler (and under the batch sampler a sharded one wraps), as Accelerate's."""
        if isinstance(self.sampler, BatchSampler):
            self.sampler.sampler = sampler
            return
        batches: Any = self.batch_sampler
        batches.sampler = sampler
        if hasattr(batches, "batch_sampler"):
            batches.batch_sampler.sampler = sampler

    # -- iteration ------------------------------------------------------------------------
    def _start_pass(self, skip: int) -> Iterator[Any]:
        # The first pass after a mid-pass checkpoint continues that pass: after skipping to where it stopped, or
        # from its start when the loop skips the done batches itself (diffusers' examples `continue` past them).
        # Either way it replays the pass's shuffle and draws nothing, as the uninterrupted run did not.
        continuing = self.cursor.resumed
        self.cursor.resumed = False
        seekable = skip > 0 and self.batch_sampler is not None and can_seek_batches(self.batch_sampler)
        # A stateful loader's first pass reads with the iterator made when the loader was built, as Accelerate's
        # (it drew then); one that must seek or replay, or whose order moved to another epoch, makes a new one.
        same_epoch = self.order is None or self.order.epoch == self.cursor.epoch
        early = self._early_iterator(keep=not continuing and not seekable and same_epoch)
        self._apply_epoch()
        if self.order is not None and not early:
            self.order.begin_pass(continuing)
        if self.rng_types and not continuing:
            from ..runtime.seeding import synchronize_rng_states

            synchronize_rng_states(self.rng_types, self.synchronized_generator)
        seeked = seekable and seek_batches(self.batch_sampler, skip)
        iterator: Iterator[Any]
        if continuing:
            # This pass continues one that began before a checkpoint, and that pass already drew the
            # DataLoader's base seed from the global RNG: drawing again would shift every later random number.
            rng_state = torch.get_rng_state()
            iterator = super().__iter__()
            torch.set_rng_state(rng_state)
        else:
            iterator = super().__iter__()
        unread = seeked
        if skip and not seeked:
            iterator, unread = skip_unread(iterator, skip)
        if unread:
            self._skipped(iterator, skip)
        return iterator

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # batches from a generator, not torch's iterator
        cursor, state = self.cursor, self.gradient_state
        self._at_boundary()  # asked for the first batch: a preemption point
        elastic = self._elastic
        if elastic is not None:  # a training pass is dealt in micro-batches, another one sharded plainly
            elastic.begin_pass(cursor.training)
        live = self._live_run()
        if live is not None and elastic is not None and elastic.dealt():  # a live run: each step at its quorum's size
            position = self.begin()
            try:
                yield from live_pass(self, elastic, live, position)
            finally:
                if state is not None:
                    state.pop(position)
            return
        skip = cursor.pending_skip + self.skip_batches
        position = self.begin()
        try:
            iterator = self._start_pass(skip)
            cursor.pending_skip, cursor.yielded = 0, skip
            sentinel = object()
            current = next(iterator, sentinel)
            while current is not sentinel:
                self._snapshot(False)  # (a stateful loader's state: `current` counts as handed out)
                following = next(iterator, sentinel)
                last = following is sentinel
                batch = self._finish(current, last)
                if last:
                    self.end_of_dataloader = position.end_of_dataloader = True
                    self._snapshot(True)
                    final = self.final_remainder()
                    if final is not None:
                        self.remainder = position.remainder = final
                if elastic is not None:
                    position.micro_batch = micro = elastic.at(cursor.yielded)
                    self._steps_at_handout = self._optimizer_steps()
                    if micro is not None and state is not None:  # the step ends where the dealing says, with or
                        state.sync_gradients = micro.ends_step      # without accumulate() (elastic runs only)
                cursor.yielded += 1
                cursor.handed_out += 1
                yield batch
                self._at_boundary()  # asked for the next batch: a preemption point
                current = following
            cursor.epoch, cursor.yielded = cursor.epoch + 1, 0
            if elastic is not None:
                elastic.training = None  # the next pass decides its own mode
        finally:  # (a loop that broke off keeps its position for a checkpoint; the next pass starts afresh)
            if state is not None:
                state.pop(position)

    def live_position(self) -> dict[str, Any]:
        """A live run's position of this loader, as a joining machine receives it (`live.py`)."""
        return self._live.as_dict()

    def heal_live_position(self, position: dict[str, Any]) -> None:
        """A live peer's position (`live_position`): this loader's pass continues from it at the next step (its epoch
        at once: a script reads it to know where its epoch loop starts)."""
        self._healed = dict(position)
        self.cursor.epoch = int(position["epoch"])

    def _saved_position(self) -> tuple[int, int | None]:
        """(position, its unit in samples): in an elastic training pass, the micro-batches of the pass before the
        step under way (a checkpoint inside a step resumes at its start, which any group size can), else this
        process's batches handed out, in global batches."""
        elastic, cursor = self._elastic, self.cursor
        if elastic is None or not elastic.dealt() or elastic.batch_size is None:
            return super()._saved_position()
        if self._live_run() is not None:  # the steps the pass has done (the group's size may have changed within the pass)
            stepped = cursor.yielded > 0 and self._optimizer_steps() > self._steps_at_handout
            return self._live.steps_done(stepped) * elastic.layout.micro_batches, elastic.batch_size
        if not cursor.yielded:  # nothing handed out since a restored position (or the pass's start)
            done, stepped = cursor.pending_skip, True
        else:
            done, stepped = cursor.yielded, self._optimizer_steps() > self._steps_at_handout
        total = elastic.micro_batches_per_pass()
        return elastic.layout.step_start(done, total, stepped), elastic.batch_size

    def _live_run(self) -> Any:
        """The live run's step rule (`hasten.facade.live.LiveStep`) this loader deals for, or None."""
        return getattr(self._elastic.source, "live", None) if self._elastic is not None else None

    def _at_boundary(self) -> None:
        """A batch boundary of a training pass: the gradient state's hook, read each time (it removes itself once it
        has nothing left to do): preemption, steps counted, a periodic save when due."""
        state = self.gradient_state
        if state is not None and state.boundary_hook is not None and self.cursor.training:
            state.boundary_hook(self)

    def load_position(self, state: dict[str, Any], restore_position: bool = True) -> None:
        """As `LoaderPositionMixin.load_position`; in a live run the training pass resumes at the saved step (the
        group deals each step at the size its quorum gives, so no batches are skipped ahead of time)."""
        super().load_position(state, restore_position)
        elastic = self._elastic
        if restore_position and self._live_run() is not None and elastic is not None and elastic.dealt() and \
                elastic.batch_size is not None:
            samples = int(state["yielded"]) * int(state.get("global_batch_size") or 0)
            self._live.step = samples // (elastic.batch_size * elastic.layout.micro_batches)
            self.cursor.pending_skip = 0

    def _optimizer_steps(self) -> int:
        """The prepared optimizers' steps so far (a step after a handed-out batch moves a checkpoint's position on)."""
        return self.gradient_state.optimizer_steps if self.gradient_state is not None else 0

    def batches_to_skip(self, state: dict[str, Any]) -> int:
        """As `LoaderPositionMixin.batches_to_skip`; in an elastic training pass, this process's micro-batches before
        the saved position (a number of samples into the pass, whatever group saved it)."""
        elastic, yielded = self._elastic, int(state["yielded"])
        if elastic is None or not elastic.dealt() or not yielded or elastic.batch_size is None:
            return super().batches_to_skip(state)
        samples = yielded * int(state.get("global_batch_size") or 0)
        if samples % elastic.batch_size:
            raise ValueError(f"the checkpoint stopped {samples} samples into epoch {state['epoch']}, which is not a whole "
                             f"number of this run's batches of {elastic.batch_size}; resume with the batch size that "
                             "saved it, or from a checkpoint saved at an epoch's end.")
        return elastic.layout.own_before(samples // elastic.batch_size)

    def _finish(self, batch: Any, last: bool) -> Any:
        """The batch as the loop gets it (on its device); `last`: no batch follows in this pass."""
        if not self._move_batches:  # (moving implies a device)
            return batch
        return send_to_device(batch, cast(torch.device, self.device), non_blocking=self._non_blocking)

    def final_remainder(self) -> int | None:
        """The remainder once the last batch is reached, when it differs from the pass's start (None: unchanged)."""
        return None

    def view_kwargs(self) -> dict[str, Any]:
        """Constructor arguments of a subclass that `skip_first_batches` passes on to a view."""
        return {}

    def _snapshot(self, finished: bool) -> None:
        """A stateful loader takes torchdata's state here (see `stateful.py`); a plain one has none."""

    def _skipped(self, iterator: Any, count: int) -> None:
        """`count` batches were skipped without being read (a stateful loader counts them, see `stateful.py`)."""

    def _early_iterator(self, keep: bool) -> bool:
        """Does this pass read with an iterator made before it (a stateful loader's, see `stateful.py`)?"""
        return False

def _takes_epoch(obj: Any) -> bool:
    return obj is not None and hasattr(obj, "set_epoch") and not isinstance(obj, SampleOrder)


def _unique(objects: list[Any]) -> tuple[Any, ...]:
    """The objects that take an epoch, each once, in order."""
    kept: list[Any] = []
    for obj in objects:
        if _takes_epoch(obj) and all(obj is not known for known in kept):
            kept.append(obj)
    return tuple(kept)


@functools.cache
def _takes_in_order() -> bool:
    """Does torchdata's StatefulDataLoader take `in_order` (torchdata >= 0.11)?"""
    import inspect

    from .stateful import _stateful_dataloader_class

    return "in_order" in inspect.signature(_stateful_dataloader_class().__init__).parameters


def get_sampler(dataloader: DataLoader) -> Any:
    """The sampler under a loader's batches (under its BatchSampler, or under the BatchSampler given as sampler).

    Example:
        >>> type(get_sampler(DataLoader(range(4), batch_size=2, shuffle=True))).__name__
        'RandomSampler'
    """
    holder = dataloader.sampler if isinstance(dataloader.sampler, BatchSampler) else dataloader.batch_sampler
    return getattr(holder, "sampler", None)
