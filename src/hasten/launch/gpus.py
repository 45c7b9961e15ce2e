"""GPU facts read without initialising CUDA in the launcher (which would break forked workers)."""

from __future__ import annotations

import shutil
import subprocess

__all__ = ["check_cuda_fp8_capability", "gpu_compute_capabilities", "parse_compute_capabilities", "get_gpu_info",
           "get_driver_version", "check_cuda_p2p_ib_support"]


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


def _query(field: str) -> list[str]:
    """One line per GPU of ``nvidia-smi --query-gpu=<field>``; raises when nvidia-smi is missing or fails."""
    executable = shutil.which("nvidia-smi")
    if executable is None:
        raise FileNotFoundError("nvidia-smi was not found on PATH; these GPU facts are read from NVIDIA's driver tool.")
    output = subprocess.run([executable, f"--query-gpu={field}", "--format=csv,noheader"], capture_output=True,
                            text=True, timeout=10, check=True).stdout
    return [line.strip() for line in output.strip().splitlines() if line.strip()]


def get_gpu_info() -> tuple[list[str], int]:
    """(names, count) of the visible NVIDIA GPUs, asked of nvidia-smi (CUDA is not initialised).

    Raises when nvidia-smi is missing, as Accelerate's does.

    Example:
        >>> import shutil
        >>> get_gpu_info()[1] >= 1 if shutil.which("nvidia-smi") else True
        True
    """
    names = [line.split(",", 1)[-1].strip() for line in _query("count,name")]
    return names, len(names)


def get_driver_version() -> str:
    """The NVIDIA driver version (of the first GPU), asked of nvidia-smi.

    Example:
        >>> import shutil
        >>> get_driver_version().count(".") >= 1 if shutil.which("nvidia-smi") else True
        True
    """
    return _query("driver_version")[0]


# Consumer GPUs whose peer-to-peer / InfiniBand transfers hang with drivers older than this one.
_P2P_IB_FAULTY = ("RTX 40",)
_P2P_IB_FIXED_DRIVER = "550.40.07"


def check_cuda_p2p_ib_support() -> bool:
    """False when several RTX 40xx GPUs run a driver older than 550.40.07 (their P2P / IB transfers hang); else True.

    Asks nvidia-smi, so CUDA is not initialised; True when it cannot tell.

    Example:
        >>> isinstance(check_cuda_p2p_ib_support(), bool)
        True
    """
    from packaging.version import Version

    try:
        names, count = get_gpu_info()
        if count > 1 and any(model in name for name in names for model in _P2P_IB_FAULTY):
            return Version(get_driver_version()) >= Version(_P2P_IB_FIXED_DRIVER)
    except Exception:  # noqa: BLE001 - no nvidia-smi, an odd driver string: nothing known against P2P
        pass
    return True
