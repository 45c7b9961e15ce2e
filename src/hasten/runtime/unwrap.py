"""The user's module inside the wrappers engines put around it (DDP, FSDP, DeepSpeed, `torch.compile`).

The peer's path for these is ``accelerate.utils.other``; `Strategy.unwrap_model` is the prepared run's own
way (it knows its engine), these work on any wrapped module; big models and the facade use them.

Example:
    >>> import torch
    >>> from hasten.runtime.unwrap import extract_model_from_parallel
    >>> net = torch.nn.Linear(2, 2)
    >>> extract_model_from_parallel(torch.nn.parallel.DataParallel(net)) is net
    True
"""

from __future__ import annotations

import inspect
from types import MethodType
from typing import Any, cast

import torch
from torch import nn

from .regional import has_compiled_regions

__all__ = ["extract_model_from_parallel", "is_compiled_module"]


def is_compiled_module(module: Any) -> bool:
    """True for the wrapper `torch.compile(module)` returns.

    Example:
        >>> is_compiled_module(torch.nn.Linear(1, 1))
        False
    """
    compiled = getattr(getattr(torch, "_dynamo", None), "eval_frame", None)
    return compiled is not None and isinstance(module, compiled.OptimizedModule)


def extract_model_from_parallel(model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True,
                                recursive: bool = False) -> nn.Module:
    """The user's module inside DDP / FSDP / DeepSpeed / `torch.compile` wrappers.

    `recursive=True` also replaces, throughout the module tree, every child
    that holds its real module as ``.module`` (a wrapper put around a
    submodule) by that module, as Accelerate's does.

    With `keep_torch_compile=True` a compiled wrapper is kept (around the
    unwrapped module); `keep_fp32_wrapper=False` also removes the
    autocast wrapper hasten put on the forward (and Transformer Engine's
    fp8 autocast, as Accelerate's), and, for a model that keeps its own
    forward as ``model._original_forward`` (Accelerate's way), every
    ``__wrapped__`` layer put over it. A model made by
    `compile_regions` counts as compiled: `keep_torch_compile=False` gives
    back the original it keeps under ``__dict__["_orig_mod"]``.

    Example:
        >>> net = torch.nn.Linear(2, 2)
        >>> extract_model_from_parallel(torch.compile(net), keep_torch_compile=False) is net
        True
    """
    whole = is_compiled_module(model)
    # compile_regions' result: compiled blocks inside, the original beside them (top level only, as the peer)
    regions = not whole and "_orig_mod" in model.__dict__ and has_compiled_regions(model)
    compiled = model if whole or regions else None
    if compiled is not None:
        model = cast(nn.Module, compiled.__dict__["_orig_mod"] if regions else compiled._orig_mod)
    wrappers: list[type] = [torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel]
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel

        wrappers.append(FullyShardedDataParallel)
    except ImportError:
        pass
    while isinstance(model, tuple(wrappers)) or type(model).__name__ == "DeepSpeedEngine":
        model = cast(nn.Module, model.module)
    if recursive:
        model = _unwrap_children(model)
    if not keep_fp32_wrapper:
        for mark in ("__wrapped_forward__", "__wrapped_fp8_forward__"):  # autocast, then TE's fp8_autocast (hasten.fp8.te)
            forward = vars(model).get("forward")
            original = getattr(forward, mark, None)
            if original is not None:
                if getattr(original, "__func__", None) is type(model).forward:
                    del model.forward
                else:
                    model.forward = original
        if "_original_forward" in vars(model):
            _restore_original_forward(model, vars(model).pop("_original_forward"))
    if compiled is not None and keep_torch_compile:
        if regions:
            compiled.__dict__["_orig_mod"] = model
        else:
            compiled._orig_mod = model
        return compiled
    return model


def _restore_original_forward(model: nn.Module, original: Any) -> None:
    """Walk `model.forward`'s ``__wrapped__`` chain down to `original` (or its end) and make that the forward."""
    forward = getattr(model, "forward")
    while forward != original and hasattr(forward, "__wrapped__"):
        forward = forward.__wrapped__
    function = getattr(forward, "__func__", forward) if getattr(forward, "__self__", None) is model else forward
    if function is type(model).forward:
        vars(model).pop("forward", None)  # the class's own forward again: nothing left on the instance
    else:
        model.forward = MethodType(function, model) if inspect.isfunction(function) else function


def _unwrap_children(module: nn.Module) -> nn.Module:
    """`module` without any `.module` wrapper, its children unwrapped in place (depth first)."""
    while isinstance(getattr(module, "module", None), nn.Module):
        module = cast(nn.Module, module.module)
    for name, child in list(module.named_children()):
        inner = _unwrap_children(child)
        if inner is not child:
            setattr(module, name, inner)
    return module
