"""Periodic checkpoints: every N optimizer steps or every N seconds, written in the background.

hasten's option (Accelerate has none): ``ProjectConfiguration(...,
automatic_checkpoint_naming=True, save_every_n_steps=500)`` or
``save_every_n_seconds=1800``. The save happens at a batch boundary right
after an optimizer step (no partial gradients: the checkpoint resumes on
any number of processes), asynchronously where the engine allows it
(`save_state(async_save=True)`; DeepSpeed saves synchronously). With time as
the measure, the processes agree that a save is due on the side channel
the preemption check already uses, and all save after the same step.

Example:
    >>> policy = PeriodicSaves(every_steps=2)
    >>> [policy.due(step, now=0.0) for step in (1, 2, 3, 4)]
    [False, True, False, True]
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

__all__ = ["PeriodicSaves"]


@dataclass
class PeriodicSaves:
    """When the next periodic checkpoint is due (see the module doc).

    Example:
        >>> policy = PeriodicSaves(every_seconds=60.0, last_save=0.0)
        >>> policy.elapsed(now=30.0), policy.elapsed(now=61.0)
        (False, True)
    """

    every_steps: int | None = None
    every_seconds: float | None = None
    last_save: float = field(default_factory=time.monotonic)
    agreed: bool = False  # the processes agreed a time-based save is due: at the next optimizer step

    def __post_init__(self) -> None:
        if self.every_steps is not None and (not isinstance(self.every_steps, int) or self.every_steps < 1):
            raise ValueError(f"save_every_n_steps must be an integer >= 1, got {self.every_steps!r}.")
        if self.every_seconds is not None and not self.every_seconds > 0:
            raise ValueError(f"save_every_n_seconds must be a number of seconds > 0, got {self.every_seconds!r}.")

    def elapsed(self, now: float) -> bool:
        """This process's clock says a time-based save is due (several processes agree on it first)."""
        return self.every_seconds is not None and now - self.last_save >= self.every_seconds

    def due(self, optimizer_steps: int, now: float, alone: bool = True) -> bool:
        """Save after optimizer step number `optimizer_steps`? (`alone`: one process, its clock decides.)"""
        if self.every_steps is not None and optimizer_steps % self.every_steps == 0:
            return True
        return self.agreed or (alone and self.elapsed(now))

    def saved(self, now: float) -> None:
        self.last_save, self.agreed = now, False
