"""The user's module inside the wrappers engines put around it (DDP, FSDP, DeepSpeed, `torch.compile`).

The peer's path for these is ``accelerate.utils.other``; `Strategy.unwrap_model` is the prepared run's own
way (it knows its engine), these work on any wrapped module; big models and the facade use them.

Example:
    >>> import torch
    >>> from hasten.unwrap import extract_model_from_parallel
    >>> net = torch.nn.Linear(2, 2)
    >>> extract_model_from_parallel(torch.nn.parallel.DataParallel(net)) is net
    True
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

__all__ = ["extract_model_from_parallel", "is_compiled_module"]


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
        model = cast(nn.Module, compiled._orig_mod)
    wrappers: list[type] = [torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel]
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel

        wrappers.append(FullyShardedDataParallel)
    except ImportError:
        pass
    while isinstance(model, tuple(wrappers)) or type(model).__name__ == "DeepSpeedEngine":
        model = cast(nn.Module, model.module)
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
