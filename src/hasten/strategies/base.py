"""The strategy interface: wrap a model, skip gradient sync, unwrap."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn


class Strategy:
    """Wraps models for one kind of run. Subclasses override what differs.

    Example:
        >>> Strategy(torch.device("cpu")).wrap_model(nn.Linear(2, 2)).weight.device.type
        'cpu'
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def wrap_model(self, model: nn.Module) -> nn.Module:
        return model.to(self.device)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Context in which backward does not synchronise gradients across processes."""
        return contextlib.nullcontext()

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return model
