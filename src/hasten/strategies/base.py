"""The strategy interface: how models are wrapped, synchronised, unwrapped, and how their state is saved.

The checkpoint layer (`hasten.checkpointing`) never reads a model or an
optimizer directly: it asks the strategy for full state dicts and gives
them back through it, so a sharded engine can gather or scatter its shards
(or supply its own sharded files) without the checkpoint layer changing.
"""

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

    # -- state for checkpoints ------------------------------------------------------------
    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The full (unsharded) state dict of a prepared model, keyed as the user's own module names it."""
        return self.unwrap_model(model).state_dict()

    def model_state_dict_shapes(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Tensors whose shapes a saved full state dict must match (no copy is made)."""
        return self.unwrap_model(model).state_dict()

    def load_model_state_dict(self, model: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
        self.unwrap_model(model).load_state_dict(state_dict)

    def optimizer_state_dict(self, optimizer: Any) -> dict[str, Any]:
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, optimizer: Any, state_dict: dict[str, Any]) -> None:
        optimizer.load_state_dict(state_dict)

    def model_gradients(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """This process's accumulated gradients (local: before the synchronising step they differ per process)."""
        return {name: p.grad for name, p in self.unwrap_model(model).named_parameters() if p.grad is not None}

    def load_model_gradients(self, model: nn.Module, gradients: dict[str, torch.Tensor]) -> None:
        """Set every gradient to the saved one (None where none was saved)."""
        for name, param in self.unwrap_model(model).named_parameters():
            saved = gradients.get(name)
            param.grad = None if saved is None else saved.to(device=param.device, dtype=param.dtype)
