"""One process, one device: the model is only moved there."""

from __future__ import annotations

from .base import Strategy


class SingleDeviceStrategy(Strategy):
    """No wrapping: `prepare` moves the model to the device and returns it as is.

    Example:
        >>> import torch
        >>> SingleDeviceStrategy(torch.device("cpu")).device
        device(type='cpu')
    """
