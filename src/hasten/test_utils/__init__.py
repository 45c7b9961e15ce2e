"""Accelerate's ``accelerate.test_utils`` path: what example scripts take from it.

`torch_device` is the device type tests run on (the accelerator torch
reports: "cuda", "mps", "xpu", ...; else "cpu"); `training` holds the mocked data loaders Accelerate's
examples switch to under ``TESTING_MOCKED_DATALOADERS=1``.

Example:
    >>> from hasten.test_utils import torch_device
    >>> torch_device in ("cpu", "cuda", "mps", "xpu")
    True
"""

from __future__ import annotations

__all__ = ["torch_device"]


def _device_type() -> str:
    """The accelerator torch reports (Accelerate 1.16's `get_torch_accelerator_backend`), else "cpu"."""
    from ..core.accelerators import get_torch_accelerator_backend

    return get_torch_accelerator_backend()[0] or "cpu"


torch_device = _device_type()
