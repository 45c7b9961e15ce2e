"""`DummyOptim` / `DummyScheduler`: stand-ins for the optimizer and scheduler a DeepSpeed config defines.

Example:
    >>> import torch
    >>> from hasten.strategies.deepspeed.dummies import DummyOptim
    >>> DummyOptim(torch.nn.Linear(2, 2).parameters(), lr=0.1).lr
    0.1
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch

__all__ = ["DummyOptim", "DummyScheduler"]


class DummyOptim(torch.optim.Optimizer):
    """Stands in for the optimizer the DeepSpeed config defines; `prepare` replaces it with DeepSpeed's.

    Its `lr` and `weight_decay` (and any other keyword) fill the config's
    ``"auto"`` optimizer parameters. It cannot step on its own.

    Example:
        >>> model = torch.nn.Linear(2, 2)
        >>> optimizer = DummyOptim(model.parameters(), lr=3e-4)
        >>> optimizer.lr, len(optimizer.param_groups[0]["params"])
        (0.0003, 2)
    """

    def __init__(self, params: Iterable[Any], lr: float = 0.001, weight_decay: float = 0, **kwargs: Any) -> None:
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, **kwargs})
        self.params = [p for group in self.param_groups for p in group["params"]]
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs
        self.scheduler: DummyScheduler | None = None  # set by a DummyScheduler built on it

    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        raise RuntimeError("a DummyOptim cannot step; pass it to accelerator.prepare together with the model first.")


class DummyScheduler(torch.optim.lr_scheduler.LRScheduler):
    """Stands in for the scheduler the DeepSpeed config defines (or builds one with `lr_scheduler_callable`).

    The DeepSpeed engine steps the real scheduler itself at every optimizer
    step, so `step()` here does nothing; `get_last_lr` and `state_dict` are
    the real scheduler's once the model is prepared.

    Example:
        >>> optimizer = DummyOptim(torch.nn.Linear(2, 2).parameters(), lr=0.1)
        >>> scheduler = DummyScheduler(optimizer, total_num_steps=100, warmup_num_steps=10)
        >>> optimizer.scheduler is scheduler, scheduler.total_num_steps
        (True, 100)
    """

    def __init__(self, optimizer: Any, total_num_steps: int | None = None, warmup_num_steps: int = 0,
                 lr_scheduler_callable: Callable[[Any], Any] | None = None, **kwargs: Any) -> None:
        # Deliberately not calling LRScheduler.__init__: the real scheduler is DeepSpeed's.
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs
        self.engine_scheduler: Any = None  # DeepSpeed's scheduler, set when the model is prepared
        if isinstance(optimizer, DummyOptim):
            optimizer.scheduler = self

    def step(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Nothing to do: the DeepSpeed engine steps its scheduler with every optimizer step."""

    def get_last_lr(self) -> list[float]:  # type: ignore[override]
        if self.engine_scheduler is not None and hasattr(self.engine_scheduler, "get_last_lr"):
            return list(self.engine_scheduler.get_last_lr())
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return self.engine_scheduler.state_dict() if self.engine_scheduler is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.engine_scheduler is not None and state_dict:
            self.engine_scheduler.load_state_dict(state_dict)
