"""Data parallel over processes with torch's DistributedDataParallel."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ...options import DistributedType
from ...runtime.precision import PrecisionPolicy
from ..base import Strategy

__all__ = ["DDPStrategy"]


class DDPStrategy(Strategy):
    """Wrap in `DistributedDataParallel`; `no_sync` skips the all-reduce on accumulation steps.

    `comm_hook(ddp_model)` registers a communication hook on each wrapped
    model (`DistributedDataParallelKwargs.register_comm_hook`).

    Example:
        >>> strategy = DDPStrategy(torch.device("cpu"), ddp_kwargs={"find_unused_parameters": False})
        >>> strategy.ddp_kwargs, strategy.distributed_type.value
        ({'find_unused_parameters': False}, 'MULTI_CPU')
    """

    name = "ddp"

    def __init__(self, device: torch.device, precision: PrecisionPolicy | None = None,
                 ddp_kwargs: dict[str, Any] | None = None, comm_hook: Callable[[nn.Module], None] | None = None) -> None:
        super().__init__(device, precision)
        self.ddp_kwargs = dict(ddp_kwargs or {})
        self.comm_hook = comm_hook

    @property
    def distributed_type(self) -> DistributedType:
        return {"cuda": DistributedType.MULTI_GPU, "mps": DistributedType.MULTI_MPS}.get(
            self.device.type, DistributedType.MULTI_CPU
        )

    def setup_module(self, model: nn.Module) -> nn.Module:
        model = super().setup_module(model)
        if not any(p.requires_grad for p in model.parameters()):
            return model  # nothing to synchronise (e.g. a frozen teacher)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=device_ids, **self.ddp_kwargs)
        if self.comm_hook is not None:
            self.comm_hook(wrapped)
        return wrapped

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        if isinstance(model, DistributedDataParallel) and not self.sync_each_batch:
            return model.no_sync()
        return contextlib.nullcontext()

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

    def needs_fillers(self, model: nn.Module) -> bool:
        """DDP communicates only in the synchronising backward (the one collective every process runs once a step),
        unless it synchronises every batch."""
        return self.sync_each_batch

    @contextlib.contextmanager
    def sync_on(self, model: nn.Module) -> Iterator[None]:
        """Inside `no_sync`, a forward and backward that synchronise (the forward prepares DDP's reduction)."""
        if not isinstance(model, DistributedDataParallel):
            yield
            return
        old = model.require_backward_grad_sync
        model.require_backward_grad_sync = True
        try:
            yield
        finally:
            model.require_backward_grad_sync = old

    @contextlib.contextmanager
    def sync_in_backward(self, model: nn.Module) -> Iterator[None]:
        """Turn DDP's gradient sync back on for the next backward, even inside `no_sync`."""
        if not isinstance(model, DistributedDataParallel):
            yield
            return
        old_backward, old_forward = model.require_backward_grad_sync, model.require_forward_param_sync
        model.require_backward_grad_sync = True
        model.require_forward_param_sync = True
        model.reducer.prepare_for_backward([])  # a DDP model inside no_sync skipped this in its forward
        try:
            yield
        finally:
            model.require_backward_grad_sync, model.require_forward_param_sync = old_backward, old_forward
