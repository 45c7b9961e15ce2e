"""Accelerate's names for what `prepare` hands back under DeepSpeed, for libraries that test for them.

transformers' `Trainer` imports `DeepSpeedSchedulerWrapper` and checks
``isinstance(scheduler, DeepSpeedSchedulerWrapper)`` to know that the
engine saves and steps the scheduler itself. hasten's DeepSpeed path
returns a scheduler of this class when the engine owns the scheduler (a
`DummyScheduler`, or one from the DeepSpeed config).
"""

from __future__ import annotations

from typing import Any

from ...runtime.optimizer import AcceleratedOptimizer
from ...runtime.scheduler import AcceleratedScheduler

__all__ = ["DeepSpeedEngineWrapper", "DeepSpeedOptimizerWrapper", "DeepSpeedSchedulerWrapper"]


class DeepSpeedSchedulerWrapper(AcceleratedScheduler):
    """A prepared scheduler that the DeepSpeed engine steps at each optimizer step, so `step()` does nothing.

    Example:
        >>> import torch
        >>> model = torch.nn.Linear(2, 2)
        >>> optimizer = AcceleratedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        >>> scheduler = DeepSpeedSchedulerWrapper(torch.optim.lr_scheduler.StepLR(optimizer.optimizer, 1, 0.5), [optimizer])
        >>> scheduler.step(); scheduler.get_last_lr()  # unchanged: the engine steps it
        [0.1]
    """

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: `accelerator.backward` steps the engine, which steps its scheduler."""


class DeepSpeedOptimizerWrapper(AcceleratedOptimizer):
    """Accelerate's class name for an optimizer the DeepSpeed engine steps (hasten's is an `AcceleratedOptimizer`).

    Example:
        >>> issubclass(DeepSpeedOptimizerWrapper, AcceleratedOptimizer)
        True
    """


class DeepSpeedEngineWrapper:
    """Holds a DeepSpeed engine; `backward(loss)` runs the engine's backward and step, as `accelerator.backward` does.

    Example:
        >>> class Engine:
        ...     def backward(self, loss, **kwargs): print("backward", loss)
        ...     def step(self): print("step")
        >>> DeepSpeedEngineWrapper(Engine()).backward(1.0)
        backward 1.0
        step
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def backward(self, loss: Any, sync_gradients: bool = True, **kwargs: Any) -> None:
        self.engine.set_gradient_accumulation_boundary(is_boundary=sync_gradients) if hasattr(
            self.engine, "set_gradient_accumulation_boundary") else None
        self.engine.backward(loss, **kwargs)
        self.engine.step()
