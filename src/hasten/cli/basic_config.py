"""`write_basic_config`: a config for this machine without questions (Accelerate's ``accelerate.utils`` function).

It writes what Accelerate's writes — Accelerate's keys, as JSON, to
Accelerate's default file (``$HF_HOME/accelerate/default_config.yaml``)
unless `save_location` names another — so `accelerate launch` finds it, and
`hasten launch --config_file PATH` reads it too. `hasten config default`
writes hasten's own layout to hasten's path instead.

Example:
    >>> from hasten.cli.basic_config import write_basic_config
    >>> write_basic_config  # doctest: +ELLIPSIS
    <function write_basic_config at ...>
"""

from __future__ import annotations

import os
from pathlib import Path

from ..launch.accelerate_config_file import ClusterConfig, default_json_config_file
from ..options.enums import ComputeEnvironment, DistributedType

__all__ = ["write_basic_config"]


def _devices() -> int:
    """Accelerator devices of this machine (CUDA, else XPU); 0 on a CPU-only machine."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.device_count()
    xpu = getattr(torch, "xpu", None)
    return xpu.device_count() if xpu is not None and xpu.is_available() else 0


def write_basic_config(mixed_precision: str = "no",
                       save_location: str | os.PathLike[str] = default_json_config_file) -> Path | bool:
    """Write a config for this machine (one process per GPU, else one process on the CPU) unless the file exists.

    Returns the path written, or False when a file is already there.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "config.yaml"
        >>> write_basic_config("no", path) == path
        True
        >>> write_basic_config("no", path)  # doctest: +ELLIPSIS
        Configuration already exists at ..., will not override. ...
        False
    """
    path = Path(save_location)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        print(f"Configuration already exists at {save_location}, will not override. Run `accelerate config` (or "
              "`hasten config`) to change it, or pass a different save_location.")
        return False
    mixed_precision = mixed_precision.lower()
    if mixed_precision not in ("no", "fp16", "bf16", "fp8"):
        raise ValueError(f"`mixed_precision` should be one of 'no', 'fp16', 'bf16', or 'fp8', not {mixed_precision!r}.")
    devices = _devices()
    kind = DistributedType.MULTI_GPU if devices > 1 else DistributedType.NO
    config = ClusterConfig(compute_environment=ComputeEnvironment.LOCAL_MACHINE, mixed_precision=mixed_precision,
                           debug=False, distributed_type=kind, num_processes=max(devices, 1),
                           use_cpu=devices == 0, enable_cpu_affinity=False)
    config.to_json_file(path)
    return path
