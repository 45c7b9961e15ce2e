"""Per-Accelerator state shared with its prepared data loaders and optimizers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["GradientState", "LoaderPosition"]


@dataclass(eq=False)  # compared by identity: each iteration has its own
class LoaderPosition:
    """Where the loader being iterated is: at its last batch? how many real samples does that batch hold?"""

    end_of_dataloader: bool = False
    remainder: int = 0  # real samples in the padded last global batch; 0 = no padding
    cursor: Any = None  # the loader's LoaderCursor (backward marks it as a training loader)
    loader: Any = None  # the prepared loader being iterated (`GradientState.active_dataloader`)


@dataclass
class GradientState:
    """Whether this step synchronises gradients, and which loader is being iterated.

    Loaders push their position when iteration starts and pop it when it
    ends, so an eval loop nested in a training loop does not clobber the
    training loader's end-of-epoch flag.

    Example:
        >>> state = GradientState(num_steps=2)
        >>> state.sync_gradients, state.end_of_dataloader
        (True, False)
    """

    num_steps: int = 1
    sync_gradients: bool = True
    step: int = 0
    sync_with_dataloader: bool = True
    # Called by a training loader each time it is asked for a batch (preemption, progress); None = nothing to do.
    boundary_hook: Callable[[Any], None] | None = None
    _positions: list[LoaderPosition] = field(default_factory=list)

    @property
    def end_of_dataloader(self) -> bool:
        return bool(self._positions) and self._positions[-1].end_of_dataloader

    @property
    def remainder(self) -> int:
        return self._positions[-1].remainder if self._positions else 0

    @property
    def in_dataloader(self) -> bool:
        return bool(self._positions)

    @property
    def active_dataloader(self) -> Any:
        """The prepared loader being iterated right now (the innermost one), or None outside a loop.

        Example:
            >>> GradientState().active_dataloader is None
            True
        """
        return self._positions[-1].loader if self._positions else None

    def _reset_state(self) -> None:
        """Forget the loaders being iterated and the accumulation count (tests and notebooks re-creating Accelerators).

        Example:
            >>> state = GradientState(step=3)
            >>> state._reset_state(); state.step
            0
        """
        self._positions.clear()
        self.step = 0
        self.sync_gradients = True

    def mark_training(self) -> None:
        """The innermost loader being iterated feeds backward(): its batch boundaries are preemption points."""
        if self._positions and self._positions[-1].cursor is not None:
            self._positions[-1].cursor.training = True

    def push(self, position: LoaderPosition) -> None:
        self._positions.append(position)

    def pop(self, position: LoaderPosition) -> None:
        if position in self._positions:
            self._positions.remove(position)
