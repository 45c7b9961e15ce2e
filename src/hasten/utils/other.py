"""Model and process helpers (``accelerate.utils.other``).

Example:
    >>> import torch
    >>> from hasten.utils.other import extract_model_from_parallel
    >>> net = torch.nn.Linear(2, 2)
    >>> extract_model_from_parallel(net) is net
    True
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..saving import load, save

__all__ = [
    "convert_bytes", "extract_model_from_parallel", "get_free_port", "get_pretty_name", "is_compiled_module",
    "is_port_in_use", "load", "merge_dicts", "recursive_getattr", "save", "wait_for_everyone", "write_basic_config",
]


def is_compiled_module(module: Any) -> bool:
    """True for the wrapper `torch.compile(module)` returns.

    Example:
        >>> is_compiled_module(torch.nn.Linear(1, 1))
        False
    """
    compiled = getattr(getattr(torch, "_dynamo", None), "eval_frame", None)
    return compiled is not None and isinstance(module, compiled.OptimizedModule)


def extract_model_from_parallel(model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True) -> nn.Module:
    """The user's module inside DDP / FSDP / DeepSpeed / `torch.compile` wrappers.

    With `keep_torch_compile=True` a compiled wrapper is kept (around the
    unwrapped module); `keep_fp32_wrapper=False` also removes the
    autocast wrapper hasten put on the forward.

    Example:
        >>> net = torch.nn.Linear(2, 2)
        >>> extract_model_from_parallel(torch.compile(net), keep_torch_compile=False) is net
        True
    """
    compiled = model if is_compiled_module(model) else None
    if compiled is not None:
        model = compiled._orig_mod
    wrappers: list[type] = [torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel]
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel

        wrappers.append(FullyShardedDataParallel)
    except ImportError:
        pass
    while isinstance(model, tuple(wrappers)) or type(model).__name__ == "DeepSpeedEngine":
        model = model.module
    if not keep_fp32_wrapper:
        forward = vars(model).get("forward")
        original = getattr(forward, "__wrapped_forward__", None)
        if original is not None:
            if getattr(original, "__func__", None) is type(model).forward:
                del model.forward
            else:
                model.forward = original
    if compiled is not None and keep_torch_compile:
        compiled._orig_mod = model
        return compiled
    return model


def wait_for_everyone() -> None:
    """Barrier across every process of the run (nothing on one process).

    Example:
        >>> wait_for_everyone()
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        from .. import watchdog

        with watchdog.waiting("wait_for_everyone"):
            dist.barrier()


def write_basic_config(mixed_precision: str = "no", save_location: str | os.PathLike[str] | None = None) -> Path | bool:
    """Write a default launch config (one process per GPU, else one process) unless the file exists.

    `save_location` defaults to hasten's config path (`hasten config`'s).
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
    from ..cli.config_command import default_config, detect_hardware
    from ..config import default_config_path, save_config
    from ..launch_spec import MIXED_PRECISION_CHOICES

    if mixed_precision not in MIXED_PRECISION_CHOICES:
        raise ValueError(f"mixed_precision={mixed_precision!r} is not one of {', '.join(MIXED_PRECISION_CHOICES)}.")
    path = Path(save_location) if save_location is not None else default_config_path()
    if path.exists():
        print(f"Configuration already exists at {path}, will not override. Run `hasten config` manually or pass a "
              "different save_location.")
        return False
    gpus, _ = detect_hardware()
    return save_config(default_config(gpus, mixed_precision), path)


def get_pretty_name(obj: Any) -> str:
    """A readable name for a class, function or object.

    Example:
        >>> get_pretty_name(torch.nn.Linear)
        'Linear'
    """
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or str(obj)


def merge_dicts(source: dict[str, Any], destination: dict[str, Any]) -> dict[str, Any]:
    """Merge `source` into `destination` recursively (nested dicts merged, other values replaced); returns it.

    Example:
        >>> merge_dicts({"a": {"b": 1}}, {"a": {"c": 2}})
        {'a': {'c': 2, 'b': 1}}
    """
    for key, value in source.items():
        if isinstance(value, dict):
            merge_dicts(value, destination.setdefault(key, {}))
        else:
            destination[key] = value
    return destination


def recursive_getattr(obj: Any, attr: str) -> Any:
    """`getattr` along a dotted path.

    Example:
        >>> recursive_getattr(torch.nn.Sequential(torch.nn.Linear(1, 2)), "0.out_features")
        2
    """
    for name in attr.split("."):
        obj = getattr(obj, name)
    return obj


def convert_bytes(size: float) -> str:
    """A byte count in readable units.

    Example:
        >>> convert_bytes(3 * 1024**2)
        '3.0 MB'
    """
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"


def is_port_in_use(port: int | None = None) -> bool:
    """True when something listens on localhost:`port` (default 29500).

    Example:
        >>> isinstance(is_port_in_use(get_free_port()), bool)
        True
    """
    port = 29500 if port is None else port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        return probe.connect_ex(("localhost", port)) == 0


def get_free_port() -> int:
    """A TCP port free on this machine right now.

    Example:
        >>> 0 < get_free_port() < 65536
        True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]
