"""GPU facts read without initialising CUDA in the launcher (which would break forked workers)."""

from __future__ import annotations

import shutil
import subprocess

__all__ = ["check_cuda_fp8_capability", "gpu_compute_capabilities", "parse_compute_capabilities"]


def parse_compute_capabilities(nvidia_smi_output: str) -> list[tuple[int, int]]:
    """Parse `nvidia-smi --query-gpu=compute_cap --format=csv,noheader` output.

    Example:
        >>> parse_compute_capabilities("8.0\\n7.5\\n")
        [(8, 0), (7, 5)]
    """
    capabilities = []
    for line in nvidia_smi_output.splitlines():
        line = line.strip()
        if "." in line:
            major, minor = line.split(".", 1)
            if major.isdigit() and minor.isdigit():
                capabilities.append((int(major), int(minor)))
    return capabilities


def gpu_compute_capabilities() -> list[tuple[int, int]]:
    """Compute capability of each visible NVIDIA GPU; [] when there are none (or no nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        output = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_compute_capabilities(output)


def check_cuda_fp8_capability() -> bool:
    """True when the first visible NVIDIA GPU can compute in fp8 (compute capability 8.9 or newer).

    Asks nvidia-smi, so CUDA is not initialised; False without a GPU.

    Example:
        >>> isinstance(check_cuda_fp8_capability(), bool)
        True
    """
    capabilities = gpu_compute_capabilities()
    return bool(capabilities) and capabilities[0] >= (8, 9)
