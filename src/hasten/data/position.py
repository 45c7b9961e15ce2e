"""A prepared loader's position: where it is in its passes, and that position as checkpoint state.

`LoaderCursor` is the position itself (epoch, batches handed out in the
current pass, a restored skip not yet used), shared by a loader and the
`skip_first_batches` views made from it. `LoaderPositionMixin` turns it
into state and back: `position_state()` is what checkpoints keep,
`load_position()` restores it (validated by `batches_to_skip`, which also
converts a position saved with another global batch size).
`DataLoaderStateMixin` is Accelerate's per-pass state (`end_of_dataloader`,
`remainder`) and the pass's registration on the `GradientState`.
`skip_unread` skips the first batches of a pass without loading them where
the dataset allows it.

`loader.py` builds `PreparedDataLoader` on these.

Example:
    >>> cursor = LoaderCursor(epoch=1, yielded=3)
    >>> cursor.pending_skip
    0
"""

from __future__ import annotations

import itertools
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Iterator, cast

from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _DatasetKind

from ..runtime.gradient_state import GradientState, LoaderPosition

__all__ = ["DataLoaderStateMixin", "LoaderCursor", "LoaderPositionMixin", "skip_unread"]


@dataclass
class LoaderCursor:
    """Where a prepared loader is; shared with the `skip_first_batches` views made from it.

    Example:
        >>> LoaderCursor(epoch=2, yielded=5)
        LoaderCursor(epoch=2, yielded=5, pending_skip=0, training=False, resumed=False)
    """

    epoch: int = 0
    yielded: int = 0  # batches handed out in the current pass (the look-ahead batch does not count)
    pending_skip: int = 0  # batches the next pass skips: a restored position
    training: bool = False  # backward() consumed this loader's batches: its boundaries are preemption points
    resumed: bool = False  # restored from a checkpoint taken in the middle of a pass (whose draws were made)
    # batches handed out over the loader's life, never reset: how far this process got (save_state's handshake)
    handed_out: int = field(default=0, repr=False)


class DataLoaderStateMixin:
    """Accelerate's loader state: `end_of_dataloader`, `remainder`, and the `GradientState` registration of a pass.

    `begin()` starts a pass (the loader becomes `GradientState().active_dataloader`),
    `end()` ends it; `PreparedDataLoader` calls both itself.

    Example:
        >>> from hasten.data import PreparedDataLoader
        >>> isinstance(PreparedDataLoader(range(4), batch_size=2), DataLoaderStateMixin)
        True
    """

    end_of_dataloader: bool = False
    remainder: int = -1
    gradient_state: GradientState | None
    dataset: Any
    _drop_last: bool = False

    def reset(self) -> None:
        """Forget the last pass's end flag and remainder."""
        self.end_of_dataloader = False
        self.remainder = -1

    def begin(self) -> LoaderPosition:
        """A pass starts: the remainder is computed and the loader is pushed on the gradient state."""
        self.reset()
        self.remainder = self._start_remainder()
        position = LoaderPosition(remainder=self.remainder, cursor=getattr(self, "cursor", None), loader=self)
        if self.gradient_state is not None:
            self.gradient_state.push(position)
        return position

    def end(self) -> None:
        """The pass is over (or abandoned): the loader leaves the gradient state."""
        if self.gradient_state is not None:
            self.gradient_state._remove_dataloader(self)

    def _start_remainder(self) -> int:
        """Accelerate's remainder at the start of a pass: samples % global batch, -1 when dropped or unknown."""
        if self._drop_last:
            return -1
        with suppress(Exception):
            length = getattr(self.dataset, "total_dataset_length", None)
            length = len(self.dataset) if length is None else length
            return int(length % self.total_batch_size)  # type: ignore[attr-defined]
        return -1


class LoaderPositionMixin:
    """A loader's position as checkpoint state: `position_state` / `load_position` over its `LoaderCursor`.

    The loader provides `cursor`, `order` (its `SampleOrder`, or None) and
    `global_batch_size`; `state_dict` / `load_state_dict` give the same
    state unless a subclass (a torchdata-backed loader) gives its own.

    Example:
        >>> from hasten.data import PreparedDataLoader
        >>> isinstance(PreparedDataLoader(range(4), batch_size=2), LoaderPositionMixin)
        True
    """

    cursor: LoaderCursor
    order: Any
    global_batch_size: int | None

    def position_state(self) -> dict[str, Any]:
        """The loader's position: epoch, batches handed out in this pass, shuffle state, batch geometry.

        Example:
            >>> import torch
            >>> from hasten.data import prepare_data_loader
            >>> loader = prepare_data_loader(DataLoader(list(range(6)), batch_size=2), torch.device("cpu"))
            >>> loader.position_state()["epoch"], loader.position_state()["yielded"]
            (0, 0)
        """
        yielded, unit = self._saved_position()
        return {
            "epoch": self.cursor.epoch,
            "yielded": yielded,
            "global_batch_size": unit,
            "num_batches": self._full_length() if self._sized() else None,
            "order": None if self.order is None else self.order.state_dict(),
        }

    def _saved_position(self) -> tuple[int, int | None]:
        """(batches handed out in this pass, the global batch size): outside a pass, a restored position not yet
        used is still the position."""
        return self.cursor.yielded or self.cursor.pending_skip, self.global_batch_size

    def load_position(self, state: dict[str, Any], restore_position: bool = True) -> None:
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
        self.cursor.resumed = int(state["yielded"]) > 0

    def state_dict(self) -> dict[str, Any]:
        """The loader's position (`position_state`); a torchdata-backed loader gives torchdata's state instead."""
        return self.position_state()

    def load_state_dict(self, state: dict[str, Any], restore_position: bool = True) -> None:
        """Restore a position given by `state_dict` (see `load_position`)."""
        self.load_position(state, restore_position)

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

    def _full_length(self) -> int:
        """Batches in a whole pass (torch's length, before a view's skipped batches); TypeError when unsized."""
        return DataLoader.__len__(cast(Any, self))  # (the mixin sits on a DataLoader)

    def _sized(self) -> bool:
        try:
            self._full_length()
        except TypeError:
            return False
        return True


def skip_unread(iterator: Any, count: int) -> tuple[Iterator[Any], bool]:
    """`iterator` without its first `count` batches, and whether they went unread: over a map-style dataset without
    workers their indices are drawn but nothing is loaded (as Accelerate's SkipBatchSampler); a stream is read and
    dropped.

    Example:
        >>> rest, unread = skip_unread(iter(DataLoader(list(range(6)), batch_size=2)), 2)
        >>> [b.tolist() for b in rest], unread
        ([[4, 5]], True)
    """
    sampler_iter = getattr(iterator, "_sampler_iter", None)
    map_style = getattr(iterator, "_dataset_kind", None) == _DatasetKind.Map
    if map_style and sampler_iter is not None and getattr(iterator, "_num_workers", 1) == 0:
        for _ in itertools.islice(sampler_iter, count):
            pass
        return iterator, True
    return itertools.islice(iterator, count, None), False  # workers already asked for them: load and drop
