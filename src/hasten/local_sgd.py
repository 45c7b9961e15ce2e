"""Local SGD: train without gradient synchronisation and average the parameters every few steps.

Example:
    >>> import torch
    >>> from hasten import Accelerator
    >>> from hasten.local_sgd import LocalSGD
    >>> accelerator = Accelerator(cpu=True)
    >>> model = accelerator.prepare(torch.nn.Linear(2, 1))
    >>> with LocalSGD(accelerator, model, local_sgd_steps=4) as local_sgd:
    ...     model(torch.ones(1, 2)).sum().backward()
    ...     local_sgd.step()
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import torch
from torch import nn

from .options import DistributedType

__all__ = ["LocalSGD"]


class LocalSGD:
    """Context manager: inside, DDP's gradient all-reduce is off; `step()` averages parameters every `local_sgd_steps` calls.

    Each process updates its own copy of the model (no communication in
    backward); every `local_sgd_steps` steps, and when the block ends, every
    parameter is replaced by its mean across processes. Call `step()` after
    each `optimizer.step()`. Disabled (`enabled=False`, or a single
    process), it does nothing.

    Example:
        >>> from hasten import Accelerator
        >>> accelerator = Accelerator(cpu=True)
        >>> model = accelerator.prepare(torch.nn.Linear(2, 1))
        >>> with LocalSGD(accelerator, model, local_sgd_steps=2, enabled=False) as local_sgd:
        ...     local_sgd.step()
        >>> local_sgd.num_steps
        1
    """

    def __init__(self, accelerator: Any, model: nn.Module, local_sgd_steps: int, enabled: bool = True) -> None:
        if accelerator.distributed_type not in (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU,
                                                DistributedType.MULTI_MPS):
            raise NotImplementedError(f"LocalSGD works with plain data parallel (DDP) only, not "
                                      f"{accelerator.distributed_type.value}; drop LocalSGD or the sharded engine.")
        if not isinstance(local_sgd_steps, int) or local_sgd_steps < 1:
            raise ValueError(f"local_sgd_steps must be an integer >= 1, got {local_sgd_steps!r}.")
        self.enabled = enabled and accelerator.distributed_type is not DistributedType.NO
        self.num_steps = 0
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self._no_sync: Any = None

    def __enter__(self) -> "LocalSGD":
        if self.enabled:
            self._no_sync = self.accelerator.strategy.no_sync(self.model)
            self._no_sync.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.enabled:
            try:
                if exc_type is None:  # after an error the peers may not be here: do not start a collective
                    self._sync_and_avg_model_params()
            finally:
                self._no_sync.__exit__(exc_type, exc, tb)

    def step(self) -> None:
        """Count an optimizer step; every `local_sgd_steps`-th one averages the parameters across processes."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._sync_and_avg_model_params()

    @torch.no_grad()
    def _sync_and_avg_model_params(self) -> None:
        import torch.distributed as dist

        from .process import watchdog

        world = dist.get_world_size()
        with watchdog.waiting("LocalSGD"):
            for param in self.accelerator.unwrap_model(self.model).parameters():
                dist.all_reduce(param.data, op=dist.ReduceOp.SUM)
                param.data.div_(world)
