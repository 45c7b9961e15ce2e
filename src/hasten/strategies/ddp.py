"""Data parallel over processes with torch's DistributedDataParallel."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .base import Strategy


class DDPStrategy(Strategy):
    """Wrap in `DistributedDataParallel`; `no_sync` skips the all-reduce on accumulation steps.

    Example:
        >>> strategy = DDPStrategy(torch.device("cpu"), {"find_unused_parameters": False})
        >>> strategy.ddp_kwargs
        {'find_unused_parameters': False}
    """

    def __init__(self, device: torch.device, ddp_kwargs: dict[str, Any]) -> None:
        super().__init__(device)
        self.ddp_kwargs = dict(ddp_kwargs)

    def wrap_model(self, model: nn.Module) -> nn.Module:
        model = model.to(self.device)
        if not any(p.requires_grad for p in model.parameters()):
            return model  # nothing to synchronise (e.g. a frozen teacher)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids, **self.ddp_kwargs)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        if isinstance(model, DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model
