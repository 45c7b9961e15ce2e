"""How a model is wrapped for the run's topology; chosen once by `select_strategy`."""

from __future__ import annotations

from typing import Any

from .base import Strategy
from .ddp import DDPStrategy
from .single import SingleDeviceStrategy

__all__ = ["Strategy", "SingleDeviceStrategy", "DDPStrategy", "select_strategy"]


def select_strategy(device: Any, world_size: int, ddp_kwargs: dict[str, Any] | None = None) -> Strategy:
    """Single device for one process, DistributedDataParallel for several.

    Example:
        >>> import torch
        >>> type(select_strategy(torch.device("cpu"), 1)).__name__
        'SingleDeviceStrategy'
    """
    if world_size > 1:
        return DDPStrategy(device, ddp_kwargs or {})
    return SingleDeviceStrategy(device)
