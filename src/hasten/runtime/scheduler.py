"""The prepared learning-rate scheduler: it steps exactly as Accelerate's does, unless asked otherwise.

By default (Accelerate's behaviour, so a script trains the same numbers
under both libraries) one `scheduler.step()` of the loop:

- does nothing on an accumulation step that does not synchronise, nor when
  fp16 loss scaling skipped the optimizer step (inf/NaN gradients);
- otherwise advances the wrapped scheduler ``num_processes`` times, or once
  with ``split_batches=True``. A schedule written for one process counts its
  steps over the whole dataset; on N processes each process sees 1/N of the
  batches, so N steps per optimizer step keep the schedule's shape. Hugging
  Face's example scripts size their schedules for this
  (``num_training_steps = max_train_steps * num_processes``). A scheduler with
  a ``total_steps`` (``OneCycleLR``) never steps past it.

``kwargs_handlers=[SchedulerKwargs(once_per_optimizer_step=True)]`` is
hasten's opt-in policy: one advance per optimizer step that happened, so a
schedule sized from the prepared loader's length (``len(prepared_dl) //
gradient_accumulation_steps * epochs``) ends exactly at its end on any
number of processes.

With ``Accelerator(step_scheduler_with_optimizer=False)`` every `step()` call
is passed through unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence, cast

from .gradient_state import GradientState
from ..options import KwargsHandler
from .optimizer import AcceleratedOptimizer

__all__ = ["AcceleratedScheduler", "SchedulerKwargs"]


@dataclass
class SchedulerKwargs(KwargsHandler):
    """hasten's scheduler option (an opt-in: the default is Accelerate's stepping, see `hasten.runtime.scheduler`).

    ``once_per_optimizer_step=True``: a prepared scheduler advances once per
    optimizer step that happened, on any number of processes, instead of
    ``num_processes`` times.

    Example:
        >>> from hasten import Accelerator
        >>> accelerator = Accelerator(cpu=True, kwargs_handlers=[SchedulerKwargs(once_per_optimizer_step=True)])
    """

    once_per_optimizer_step: bool = False


class AcceleratedScheduler:
    """Wraps a torch LR scheduler so that it steps only when its optimizer stepped (see module doc).

    `num_processes` is how many times one optimizer step advances the
    scheduler when `split_batches` is False (default: the number of
    processes of the run).

    Example:
        >>> import torch
        >>> param = torch.nn.Parameter(torch.ones(1))
        >>> opt = torch.optim.SGD([param], lr=1.0)
        >>> sched = AcceleratedScheduler(torch.optim.lr_scheduler.StepLR(opt, 1, 0.5), [], num_processes=2)
        >>> opt.step(); sched.step(); sched.get_last_lr()  # two processes: two steps of the schedule per optimizer step
        [0.25]
    """

    def __init__(
        self,
        scheduler: Any,
        optimizers: AcceleratedOptimizer | Sequence[AcceleratedOptimizer],
        step_with_optimizer: bool = True,
        split_batches: bool = False,
        *,
        gradient_state: GradientState | None = None,
        num_processes: int | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.optimizers: list[AcceleratedOptimizer] = (list(optimizers) if isinstance(optimizers, (list, tuple))
                                                       else [cast(AcceleratedOptimizer, optimizers)])
        self.gradient_state = gradient_state if gradient_state is not None else GradientState()
        self.step_with_optimizer = step_with_optimizer
        self.split_batches = split_batches
        if num_processes is None:
            from .state import PartialState

            num_processes = PartialState().num_processes
        # Decided once: how many times the wrapped scheduler advances per optimizer step.
        self.steps_per_optimizer_step = 1 if split_batches else int(num_processes)
        self._total_steps = getattr(scheduler, "total_steps", None)

    def step(self, *args: Any, **kwargs: Any) -> None:
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            return
        for opt in self.optimizers:
            if opt.step_was_skipped:
                return
        scheduler = self.scheduler
        for _ in range(self.steps_per_optimizer_step):
            # OneCycleLR raises past its total_steps: a last short epoch must not push it there.
            if self._total_steps is not None and scheduler._step_count > self._total_steps:
                continue
            scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def get_lr(self) -> list[float]:
        return self.scheduler.get_lr()

    def print_lr(self, *args: Any, **kwargs: Any) -> Any:
        return self.scheduler.print_lr(*args, **kwargs)

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
