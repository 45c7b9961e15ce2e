"""Accelerate's ``accelerate.test_utils`` path: what example scripts take from it.

`torch_device` is the device type tests run on ("cuda", "mps", "xpu" when
present, else "cpu"); `training` holds the mocked data loaders Accelerate's
examples switch to under ``TESTING_MOCKED_DATALOADERS=1``.

Example:
    >>> from hasten.test_utils import torch_device
    >>> torch_device in ("cpu", "cuda", "mps", "xpu")
    True
"""

from __future__ import annotations

__all__ = ["torch_device"]


def _device_type() -> str:
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch, "xpu", None) is not None and torch.xpu.is_available():
        return "xpu"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"


torch_device = _device_type()
