"""Which accelerator torch sees, found through ``torch.accelerator`` (Accelerate 1.16's device discovery).

Accelerate 1.16 asks torch which accelerator this process has (`get_torch_accelerator_backend`) instead of
probing each vendor's package in turn; its default distributed backend, the variable that hides devices from a
process and the spelling of a bare device index follow from that one answer. On a machine without an
accelerator the answer is ``(None, None)``, and every consumer falls back to the CPU.

Example:
    >>> from hasten.core.accelerators import get_distributed_backend
    >>> get_distributed_backend("cuda"), get_distributed_backend(None)
    ('nccl', None)
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

__all__ = ["DEVICE_VISIBLE_DEVICES_ENV_VARS", "TORCH_DISTRIBUTED_BACKENDS", "get_accelerator_free_memory",
           "get_distributed_backend", "get_torch_accelerator_backend", "normalize_device"]

# The default torch.distributed backend of each accelerator type (``accelerate.utils.constants``).
TORCH_DISTRIBUTED_BACKENDS = {"cuda": "nccl", "mlu": "cncl", "sdaa": "tccl", "musa": "mccl", "npu": "hccl",
                              "hpu": "hccl", "xpu": "xccl", "neuron": "neuron"}
# The variable that limits which devices of each type a process sees (``--gpu_ids`` sets it).
DEVICE_VISIBLE_DEVICES_ENV_VARS = {"cuda": "CUDA_VISIBLE_DEVICES", "xpu": "ZE_AFFINITY_MASK",
                                   "mlu": "MLU_VISIBLE_DEVICES", "sdaa": "SDAA_VISIBLE_DEVICES",
                                   "musa": "MUSA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES",
                                   "hpu": "HABANA_VISIBLE_MODULES", "neuron": "NEURON_RT_VISIBLE_CORES"}
# Device types whose own torch module (``torch.cuda``, ``torch.xpu``, ...) answers rather than ``torch.accelerator``.
_NATIVE_MODULES = {"cuda", "mps", "mlu", "sdaa", "musa", "npu", "hpu", "xpu", "neuron"}


def get_torch_accelerator_backend(check_available: bool = True) -> tuple[str | None, ModuleType | Any]:
    """``(device type, its torch module)`` of the accelerator torch reports, or ``(None, None)`` when there is none.

    With ``check_available=False`` the type is named without asking the device whether it can be used (what a
    launcher does before it forks: asking CUDA would initialise it). Vendor accelerators hasten has no backend for
    (MLU, NPU, HPU, ...) count as unavailable, as their ``is_*_available`` probes say.

    Example:
        >>> import torch
        >>> device_type, module = get_torch_accelerator_backend()
        >>> device_type is None or module is not None
        True
    """
    import torch

    from . import availability

    try:
        device = torch.accelerator.current_accelerator()
    except RuntimeError:  # some torch builds raise instead of answering None when there is no accelerator
        device = None
    if device is None:
        return None, None
    probe = getattr(availability, f"is_{device.type}_available", None)
    available = probe if callable(probe) else torch.accelerator.is_available
    if check_available and not available():
        return None, None
    if device.type in _NATIVE_MODULES:
        return device.type, torch.get_device_module(device.type)
    return device.type, torch.accelerator


def get_distributed_backend(device_type: str | None) -> str | None:
    """The default torch.distributed backend of `device_type` (``"nccl"`` for CUDA), or None when it has none here.

    Example:
        >>> get_distributed_backend("cuda"), get_distributed_backend("cpu")
        ('nccl', None)
    """
    if device_type == "xpu":
        from .availability import is_xccl_available

        if not is_xccl_available():
            return None
    return TORCH_DISTRIBUTED_BACKENDS.get(device_type or "")


def normalize_device(device: Any) -> Any:
    """A device as torch's ``.to()`` takes it: a bare index gets the accelerator's type (``3`` → ``"xpu:3"``).

    CUDA, and a machine with no accelerator, keep the bare index (torch reads it as CUDA's); ``"npu"`` gets an
    explicit ``:0``; anything else is returned unchanged.

    Example:
        >>> normalize_device("cpu"), normalize_device(0)
        ('cpu', 0)
    """
    if device == "npu":
        return "npu:0"
    if isinstance(device, int) and not isinstance(device, bool):
        device_type, _ = get_torch_accelerator_backend(check_available=False)
        if device_type == "hpu":
            return "hpu"
        if device_type not in (None, "cuda"):
            return f"{device_type}:{device}"
    return device


def get_accelerator_free_memory(device_module: Any, device_index: int) -> int:
    """Free bytes on device `device_index`, asked through `device_module` (as `get_torch_accelerator_backend` gave it).

    Example:
        >>> class FakeDevice:
        ...     @staticmethod
        ...     def mem_get_info(index): return (1024, 4096)
        >>> get_accelerator_free_memory(FakeDevice, 0)
        1024
    """
    import torch

    if device_module is torch.accelerator and hasattr(device_module, "get_memory_info"):
        return int(device_module.get_memory_info(device_index)[0])
    if device_module is torch.accelerator:
        device = torch.accelerator.current_accelerator()
        device_module = torch.get_device_module(device)
    return int(device_module.mem_get_info(device_index)[0])
