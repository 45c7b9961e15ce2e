"""Models quantized by bitsandbytes and spread by a device map: where they may be trained.

Such a model (``is_loaded_in_8bit`` / ``is_loaded_in_4bit`` with an
``hf_device_map``, as ``transformers`` loads it) cannot be moved to another
device, so preparing it checks its placement instead, with Accelerate's rules.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..core.availability import is_bitsandbytes_multi_backend_available, is_xpu_available

__all__ = ["check_quantized_placement"]


def _index(device: Any) -> int | None:
    """The device index a device-map value names: 0 / "cuda:1" / torch.device("cuda", 2); None for "cpu"."""
    if isinstance(device, torch.device):
        return device.index
    if isinstance(device, str):
        return None if device == "disk" else torch.device(device).index
    return None if device is None else int(device)


def check_quantized_placement(model: nn.Module, device: torch.device, distributed: bool) -> None:
    """Refuse to train an 8-bit/4-bit model whose device map cannot work on `device` (a no-op for other models).

    Refused: several devices under a distributed setting, one device that
    is not `device` (GPU 0 is accepted when `device` has no index), and any
    "cpu" (unless bitsandbytes' multi-backend build is installed, and not
    on XPU) or "disk" entry.

    Example:
        >>> model = nn.Linear(2, 2)
        >>> model.is_loaded_in_8bit, model.hf_device_map = True, {"": "disk"}
        >>> check_quantized_placement(model, torch.device("cpu"), distributed=False)
        Traceback (most recent call last):
        ...
        ValueError: You can't train a model that has been loaded in 8-bit or 4-bit precision with CPU or disk offload: its device map puts weights on ['disk']; load it entirely on the training device, or install bitsandbytes' multi-backend build to train it on the CPU.
    """
    quantized = getattr(model, "is_loaded_in_8bit", False) or getattr(model, "is_loaded_in_4bit", False)
    device_map = getattr(model, "hf_device_map", None)
    if not quantized or not device_map:
        return
    devices = set(device_map.values())
    if len(devices) > 1 and distributed:
        raise ValueError("You can't train a model that has been loaded in 8-bit or 4-bit precision on multiple devices "
                         "in any distributed mode; to train it across several GPUs, run one process without a distributed "
                         "setting (naive pipeline parallelism).")
    if len(devices) == 1:
        index = _index(next(iter(devices)))
        on_cpu_with_bnb = device.type == "cpu" and is_bitsandbytes_multi_backend_available()
        placed = torch.device(device.type) if index is None else torch.device(device.type, index)
        if not on_cpu_with_bnb and placed != device and (device.index is not None or index != 0):
            raise ValueError("You can't train a model that has been loaded in 8-bit or 4-bit precision on a different "
                             f"device than the one you're training on ({device}); load it there, e.g. with "
                             "device_map={'': torch.cuda.current_device()}.")
    offloaded = sorted(str(d) for d in devices if d in ("cpu", "disk"))
    if "disk" in devices or ("cpu" in devices and (not is_bitsandbytes_multi_backend_available() or is_xpu_available())):
        raise ValueError("You can't train a model that has been loaded in 8-bit or 4-bit precision with CPU or disk "
                         f"offload: its device map puts weights on {offloaded}; load it entirely on the training device, "
                         "or install bitsandbytes' multi-backend build to train it on the CPU.")
