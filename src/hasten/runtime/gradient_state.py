"""Gradient-synchronisation state shared by the Accelerator, its prepared loaders, optimizers and schedulers.

As in Accelerate, `GradientState()` is one state per process: every instance
shares it, so code that asks ``GradientState().end_of_dataloader`` (or a
library that does) sees what the running loop sees. `_reset_state()` empties
it (tests and notebooks that build a new Accelerator do that).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

__all__ = ["GradientState", "LoaderPosition"]


@dataclass(eq=False)  # compared by identity: each iteration has its own
class LoaderPosition:
    """Where the loader being iterated is: at its last batch? how many samples does its last global batch hold?

    `remainder` follows Accelerate: ``len(dataset) % total_batch_size`` when
    the loader keeps its last batch and the dataset has a length, else -1;
    `gather_for_metrics` truncates the gathered last batch to it when > 0.
    """

    end_of_dataloader: bool = False
    remainder: int = -1
    cursor: Any = None  # the loader's LoaderCursor (backward marks it as a training loader)
    loader: Any = None  # the prepared loader being iterated (`GradientState.active_dataloader`)
    # an elastic run's training pass: the batch just handed out as a micro-batch of its step (`MicroBatch`)
    micro_batch: Any = None


_DEFAULTS: dict[str, Any] = {
    "sync_gradients": True,
    "step": 0,
    "plugin_kwargs": {},
    # optimizer steps the prepared optimizers took (a loader tells a checkpoint taken after a step from one before it)
    "optimizer_steps": 0,
    # Called by a training loader each time it is asked for a batch (preemption, progress); None = nothing to do.
    "boundary_hook": None,
}


class GradientState:
    """Whether this step synchronises gradients, and which loader is being iterated (one per process).

    Loaders push their position when iteration starts and pop it when it
    ends, so an eval loop nested in a training loop does not clobber the
    training loader's end-of-epoch flag.

    The settings live where Accelerate keeps them, in `plugin_kwargs`: the
    `GradientAccumulationPlugin`'s non-default keywords (its `to_kwargs()`),
    which libraries read (transformers' Trainer looks up ``sync_each_batch``
    there); `num_steps`, `sync_with_dataloader` and `adjust_scheduler` read
    them with Accelerate's defaults. A later plugin with other settings
    replaces them; hasten's `num_steps` / `sync_with_dataloader` keywords (and
    setters) write into them.

    Example:
        >>> GradientState._reset_state()
        >>> state = GradientState(num_steps=2)
        >>> state.sync_gradients, state.end_of_dataloader, GradientState().num_steps
        (True, False, 2)
        >>> state.plugin_kwargs
        {'num_steps': 2}
    """

    _shared_state: ClassVar[dict[str, Any]] = {}

    sync_gradients: bool
    step: int
    optimizer_steps: int
    plugin_kwargs: dict[str, Any]
    boundary_hook: Callable[[Any], None] | None

    def __init__(self, gradient_accumulation_plugin: Any = None, *, num_steps: int | None = None,
                 sync_with_dataloader: bool | None = None) -> None:
        self.__dict__ = self._shared_state
        if not self._shared_state:
            self.__dict__.update({k: (dict(v) if isinstance(v, dict) else v) for k, v in _DEFAULTS.items()})
            self._positions: list[LoaderPosition] = []
        if gradient_accumulation_plugin is not None:
            given = gradient_accumulation_plugin.to_kwargs()
            if given != self.plugin_kwargs:  # as Accelerate: a plugin with other settings replaces them
                self.plugin_kwargs = given
        if num_steps is not None:
            self.num_steps = num_steps
        if sync_with_dataloader is not None:
            self.sync_with_dataloader = sync_with_dataloader

    @property
    def initialized(self) -> bool:
        """True once a GradientState was created in this process (and not reset since)."""
        return bool(GradientState._shared_state)

    @property
    def num_steps(self) -> int:
        """The number of batches whose gradients are accumulated before the optimizer steps (1 when not set)."""
        return self.plugin_kwargs.get("num_steps", 1)

    @num_steps.setter
    def num_steps(self, steps: int) -> None:
        self.plugin_kwargs["num_steps"] = steps  # in place, as Accelerate's `gradient_accumulation_steps` setter

    @property
    def sync_with_dataloader(self) -> bool:
        """Whether the last batch of a loader always synchronises and restarts the count (True when not set)."""
        return self.plugin_kwargs.get("sync_with_dataloader", True)

    @sync_with_dataloader.setter
    def sync_with_dataloader(self, value: bool) -> None:
        self.plugin_kwargs["sync_with_dataloader"] = value

    @property
    def adjust_scheduler(self) -> bool:
        """Accelerate's flag, read from the plugin's non-default settings (so False unless set explicitly)."""
        return bool(self.plugin_kwargs.get("adjust_scheduler", False))

    @property
    def end_of_dataloader(self) -> bool:
        return bool(self._positions) and self._positions[-1].end_of_dataloader

    @property
    def remainder(self) -> int:
        """The active loader's remainder (see `LoaderPosition`); -1 outside a loader."""
        return self._positions[-1].remainder if self._positions else -1

    @property
    def in_dataloader(self) -> bool:
        return bool(self._positions)

    @property
    def position(self) -> LoaderPosition | None:
        """Where the innermost loader being iterated is (None outside a loop)."""
        return self._positions[-1] if self._positions else None

    @property
    def active_dataloader(self) -> Any:
        """The prepared loader being iterated right now (the innermost one), or None outside a loop.

        Example:
            >>> GradientState._reset_state()
            >>> GradientState().active_dataloader is None
            True
        """
        return self._positions[-1].loader if self._positions else None

    @property
    def dataloader_references(self) -> list[Any]:
        """The loaders being iterated, outermost first, after a leading None (Accelerate's layout)."""
        return [None] + [position.loader for position in self._positions]

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        self.sync_gradients = sync_gradients

    @staticmethod
    def _reset_state() -> None:
        """Forget everything: the next `GradientState()` starts afresh (tests and notebooks re-creating Accelerators).

        Example:
            >>> GradientState(num_steps=3).num_steps
            3
            >>> GradientState._reset_state(); GradientState().num_steps
            1
        """
        GradientState._shared_state.clear()

    def mark_training(self) -> None:
        """The innermost loader being iterated feeds backward(): its batch boundaries are preemption points."""
        if self._positions and self._positions[-1].cursor is not None:
            self._positions[-1].cursor.training = True

    def push(self, position: LoaderPosition) -> None:
        self._positions.append(position)

    def pop(self, position: LoaderPosition) -> None:
        positions = self.__dict__.get("_positions", ())  # (none after `_reset_state`: a pass outlived its state)
        if position in positions:
            positions.remove(position)

    def _remove_dataloader(self, dataloader: Any) -> None:
        """Forget every pass of `dataloader` (Accelerate's name: a loader's `end()` calls it)."""
        self._positions[:] = [position for position in self._positions if position.loader is not dataloader]

    def __repr__(self) -> str:
        return (f"GradientState(sync_gradients={self.sync_gradients}, end_of_dataloader={self.end_of_dataloader}, "
                f"remainder={self.remainder}, num_steps={self.num_steps})")
