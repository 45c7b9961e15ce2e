"""The prepared learning-rate scheduler and hasten's scheduler policy.

Policy: **the scheduler advances once per optimizer step that really
happened.** Size your schedule in optimizer steps as your loop sees them on
one process. The last batch of every epoch also steps, so with
accumulation: ``num_training_steps = math.ceil(len(prepared_train_dl) /
gradient_accumulation_steps) * epochs``. So:

- it does not advance on accumulation steps that do not synchronise;
- it does not advance when fp16 skipped the optimizer step (inf/NaN);
- it does NOT advance `num_processes` times per step (a peer library does,
  assuming the schedule was sized for one process and its larger number of
  steps; that surprises users whose schedule already uses the prepared
  loader's length).

With ``Accelerator(step_scheduler_with_optimizer=False)`` every `step()` call
is passed through unchanged.
"""

from __future__ import annotations

from typing import Any, Sequence

from .gradient_state import GradientState
from .optimizer import AcceleratedOptimizer

__all__ = ["AcceleratedScheduler"]


class AcceleratedScheduler:
    """Wraps a torch LR scheduler to follow hasten's scheduler policy (see module doc).

    Example:
        >>> import torch
        >>> param = torch.nn.Parameter(torch.ones(1))
        >>> opt = torch.optim.SGD([param], lr=1.0)
        >>> sched = AcceleratedScheduler(torch.optim.lr_scheduler.StepLR(opt, 1, 0.5), [], GradientState())
        >>> sched.step(); sched.get_last_lr()
        [0.5]
    """

    def __init__(
        self,
        scheduler: Any,
        optimizers: Sequence[AcceleratedOptimizer],
        gradient_state: GradientState,
        step_with_optimizer: bool = True,
    ) -> None:
        self.scheduler = scheduler
        self.optimizers = list(optimizers)
        self.gradient_state = gradient_state
        self.step_with_optimizer = step_with_optimizer

    def step(self, *args: Any, **kwargs: Any) -> None:
        if self.step_with_optimizer:
            if not self.gradient_state.sync_gradients:
                return
            if any(opt.step_was_skipped for opt in self.optimizers):
                return
        self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        if name == "scheduler":  # not set yet (during unpickling)
            raise AttributeError(name)
        return getattr(self.scheduler, name)

    def __repr__(self) -> str:
        return f"AcceleratedScheduler({self.scheduler!r})"
