"""One process, one device: the model is only cast and moved there."""

from __future__ import annotations

from .base import Strategy

__all__ = ["SingleDeviceStrategy"]


class SingleDeviceStrategy(Strategy):
    """No wrapping: `prepare` moves the model to the device and returns it as is.

    Example:
        >>> import torch
        >>> SingleDeviceStrategy(torch.device("cpu")).distributed_type.value
        'NO'
    """

    name = "single"
