"""Pinning this process to the CPU cores next to its GPU (NUMA affinity), as Accelerate's `set_numa_affinity`.

The cores come from the GPU's driver: NVML (the `nvidia-ml-py` package) on
NVIDIA GPUs, amdsmi on ROCm. Without a CUDA device nothing changes. The
peer's path is ``accelerate.utils.environment``.

Example:
    >>> import torch
    >>> set_numa_affinity(0) if not torch.cuda.is_available() else None  # no GPU: nothing to pin
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import math
import os

__all__ = ["set_numa_affinity", "override_numa_affinity", "parse_cpu_list"]

logger = logging.getLogger(__name__)


def parse_cpu_list(cpu_list: str) -> list[int]:
    """The CPU numbers of a Linux CPU list such as ``"0-3,8,10-11"``.

    Example:
        >>> parse_cpu_list("0-3,8,10-11")
        [0, 1, 2, 3, 8, 10, 11]
    """
    cpus: list[int] = []
    for part in filter(None, (p.strip() for p in cpu_list.split(","))):
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def _rocm_cores(local_process_index: int) -> list[int]:
    if importlib.util.find_spec("amdsmi") is None:
        raise ImportError("pinning CPU cores next to a ROCm GPU needs the amdsmi package, which ships with ROCm; "
                          "put ROCm's Python bindings on PYTHONPATH.")
    import amdsmi

    amdsmi.amdsmi_init()
    try:
        handle = amdsmi.amdsmi_get_processor_handles()[local_process_index]
        node = amdsmi.amdsmi_topo_get_numa_node_number(handle)
    finally:
        amdsmi.amdsmi_shut_down()
    if node is None or node < 0:  # the GPU belongs to no NUMA node: every core this process may use
        return sorted(os.sched_getaffinity(0))
    with open(f"/sys/devices/system/node/node{node}/cpulist") as listing:
        return parse_cpu_list(listing.read())


def _nvidia_cores(local_process_index: int) -> list[int]:
    if importlib.util.find_spec("pynvml") is None:
        raise ImportError("pinning CPU cores next to an NVIDIA GPU needs NVML's Python bindings; install them with "
                          "`pip install nvidia-ml-py`.")
    import pynvml

    pynvml.nvmlInit()
    words = pynvml.nvmlDeviceGetCpuAffinity(pynvml.nvmlDeviceGetHandleByIndex(local_process_index),
                                            math.ceil((os.cpu_count() or 1) / 64))
    # Word w, bit b set: core 64 * w + b is near the GPU.
    return [64 * index + bit for index, word in enumerate(words) for bit in range(64) if word >> bit & 1]


def override_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """Pin this process to the cores of the NUMA node of GPU `local_process_index` (recomputed on every call).

    `verbose` (default: on in debug mode, ``ACCELERATE_DEBUG_MODE``) logs the
    cores chosen. Without a CUDA/ROCm device this does nothing.

    Example:
        >>> import torch
        >>> override_numa_affinity(0) if not torch.cuda.is_available() else None
    """
    import torch

    if verbose is None:
        verbose = os.environ.get("ACCELERATE_DEBUG_MODE", "").lower() in ("1", "true", "yes", "y", "on", "t")
    if not torch.cuda.is_available():
        return
    cores = _rocm_cores(local_process_index) if torch.version.hip is not None else _nvidia_cores(local_process_index)
    os.sched_setaffinity(0, cores)
    if verbose:
        pinned = os.sched_getaffinity(0)
        logger.info(f"Assigning {len(pinned)} cpu cores to process {local_process_index}: {pinned}")


@functools.lru_cache(maxsize=None)
def set_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """`override_numa_affinity`, done once per process (later calls with the same arguments do nothing).

    Example:
        >>> import torch
        >>> set_numa_affinity(0) if not torch.cuda.is_available() else None
    """
    override_numa_affinity(local_process_index=local_process_index, verbose=verbose)
