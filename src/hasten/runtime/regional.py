"""Regional compilation: `torch.compile` each repeated block (and the rest of the model piece by piece).

A transformer is mostly N copies of one block class in an `nn.ModuleList`.
Compiling the blocks one after another lets dynamo reuse the first block's
graph for the others (same code, same guards), so the cold start costs about
one block instead of the whole model, and the steady speed stays close to a
whole-model compile. These are the peer's ``accelerate.utils.other``
functions, with its meaning:

- `compile_regions` returns a NEW module (its repeated blocks and every other
  leaf wrapped by `torch.compile`) and keeps the original under
  ``__dict__["_orig_mod"]``, so `extract_model_from_parallel(...,
  keep_torch_compile=False)` gives the original back;
- `compile_regions_deepspeed` / `compile_regions_fsdp2` compile the same
  regions IN PLACE (`nn.Module.compile`): the module, its type, its hooks and
  its state dict keys stay as they were. `Accelerator.prepare` uses this form
  under `TorchDynamoPlugin(use_regional_compilation=True)`, as it compiles
  whole models in place.

Example:
    >>> import torch
    >>> from hasten.runtime.regional import compile_regions, has_compiled_regions
    >>> net = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(2, 2)] * 2))
    >>> has_compiled_regions(compile_regions(net, backend="eager"))
    True
"""

from __future__ import annotations

import copy as _copy
import functools
from types import MethodType
from typing import Any, cast

import torch
from torch import nn

__all__ = ["compile_in_place", "compile_regions", "compile_regions_deepspeed", "compile_regions_fsdp2",
           "has_compiled_regions", "has_repeated_blocks", "is_repeated_blocks"]


def _optimized_module() -> type | None:
    eval_frame = getattr(getattr(torch, "_dynamo", None), "eval_frame", None)
    return getattr(eval_frame, "OptimizedModule", None)


def is_repeated_blocks(module: nn.Module) -> bool:
    """True for a non-empty `nn.ModuleList` whose members are all of its first member's class.

    Example:
        >>> is_repeated_blocks(torch.nn.ModuleList([torch.nn.Linear(1, 1), torch.nn.Linear(2, 2)]))
        True
    """
    return isinstance(module, nn.ModuleList) and len(module) > 0 and all(isinstance(m, type(module[0])) for m in module)


def has_repeated_blocks(module: nn.Module) -> bool:
    """True when the module, or any module inside it, `is_repeated_blocks`.

    Example:
        >>> has_repeated_blocks(torch.nn.Sequential(torch.nn.Linear(1, 1)))
        False
    """
    return bool(module._modules) and any(is_repeated_blocks(m) for m in module.modules())


def has_compiled_regions(module: nn.Module) -> bool:
    """True when a module inside this one is a `torch.compile` wrapper (what `compile_regions` makes).

    Example:
        >>> has_compiled_regions(torch.nn.Sequential(torch.compile(torch.nn.Linear(1, 1), backend="eager")))
        True
    """
    optimized = _optimized_module()
    return optimized is not None and bool(module._modules) and any(isinstance(m, optimized) for m in module.modules())


def _rebound(value: Any, old: nn.Module, new: nn.Module) -> Any:
    """`value` with `old` replaced by `new` where it is bound: a method of `old`, or a `functools.partial` (an
    accelerate hook's forward is one) taking `old` among its arguments, or wrapping such a method."""
    if isinstance(value, MethodType) and value.__self__ is old:
        return MethodType(value.__func__, new)
    if isinstance(value, functools.partial):
        args = tuple(new if arg is old else arg for arg in value.args)
        keywords = {key: new if arg is old else arg for key, arg in value.keywords.items()}
        rebound = functools.partial(_rebound(value.func, old, new), *args, **keywords)
        rebound.__dict__.update(value.__dict__)
        if hasattr(value, "__wrapped__"):
            rebound.__wrapped__ = _rebound(value.__wrapped__, old, new)  # type: ignore[attr-defined]
        return rebound
    return value


def _rebind_all(old: nn.Module, new: nn.Module) -> None:
    """Point what `new` shares with `old` (methods patched onto the instance, hooks' forwards) at `new`."""
    for name, value in list(new.__dict__.items()):
        new.__dict__[name] = _rebound(value, old, new)


def _shallow_copy(module: nn.Module) -> nn.Module:
    """A new instance sharing the module's attributes (bound methods rebound to it) with no children yet."""
    copy = type(module).__new__(type(module))
    copy.__dict__.update(module.__dict__)
    # a forward patched onto the instance (hooks, autocast) must call the copy, whose children are compiled
    _rebind_all(module, copy)
    copy._modules = {}
    return copy


def _compiled_block(block: nn.Module, kwargs: dict[str, Any]) -> nn.Module:
    """A repeated block compiled for `compile_regions`: a copy (sharing the block's children and weights, its own
    training flag and bound methods) compiled in place, then wrapped. The in-place compile also reaches a block
    that calls ``nn.Module.__call__`` from a `__call__` of its own, as transformers' checkpointed layers do (inside
    `torch.utils.checkpoint`, which dynamo does not trace), as Accelerate 1.16's does; the original stays as it was.
    """
    copy = _copy.copy(block)
    _rebind_all(block, copy)
    compile_in_place(copy, **kwargs)
    return cast(nn.Module, torch.compile(copy, **kwargs))


def _compile_out_of_place(module: nn.Module, kwargs: dict[str, Any]) -> nn.Module:
    if is_repeated_blocks(module):
        return nn.ModuleList([_compiled_block(block, kwargs) for block in cast(nn.ModuleList, module)])
    if has_repeated_blocks(module):
        copy = _shallow_copy(module)
        for name, child in module.named_children():
            copy.add_module(name, _compile_out_of_place(child, kwargs))
        return copy
    return cast(nn.Module, torch.compile(module, **kwargs))


def compile_regions(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """Compile each repeated block of `module`, and each other part whole, in a new module; the original is kept.

    The blocks are compiled in order, so the first block's graph serves the
    others. The result keeps the original model under
    ``result.__dict__["_orig_mod"]`` (unwrap it with
    `extract_model_from_parallel(result, keep_torch_compile=False)`); its
    state dict keys carry ``_orig_mod.`` inside each compiled part, as the
    peer's. A module without repeated blocks is compiled whole.

    Example:
        >>> from hasten.utils import compile_regions, extract_model_from_parallel
        >>> net = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(3)]))
        >>> compiled = compile_regions(net, backend="eager")
        >>> type(compiled[0][1]).__name__, extract_model_from_parallel(compiled, keep_torch_compile=False) is net
        ('OptimizedModule', True)
    """
    compiled = _compile_out_of_place(module, compile_kwargs)
    if "_orig_mod" not in compiled.__dict__:
        compiled.__dict__["_orig_mod"] = module  # in __dict__, not a child: the original stays out of state_dict()
    return compiled


def _skipped_by_dynamo(module: nn.Module) -> bool:
    """True for torch's own modules (nn.Linear, nn.TransformerEncoderLayer...): dynamo does not trace their frames."""
    try:
        from torch._dynamo import trace_rules
    except ImportError:
        return type(module).__module__.startswith("torch.")
    return isinstance(module.forward, MethodType) and bool(trace_rules.check(module.forward))


def compile_in_place(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """`module.compile(**compile_kwargs)`, which also compiles torch's own module classes; returns `module`.

    `nn.Module.compile` compiles `__call__`, whose frame dynamo skips, and
    catches the forward frame below it; but dynamo skips the forward of
    torch's own classes too, so for an `nn.Linear`, an `nn.Sequential` or
    an `nn.TransformerEncoderLayer` nothing is compiled at all. For those,
    the call is wrapped in a frame dynamo traces (what `torch.compile(module)`
    does for them), hooks included.

    Example:
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> compile_in_place(net, backend="eager") is net and net._compiled_call_impl is not None
        True
    """
    if _skipped_by_dynamo(module):
        from torch._dynamo.external_utils import wrap_inline

        module._compiled_call_impl = torch.compile(wrap_inline(module._call_impl), **compile_kwargs)
    else:
        module.compile(**compile_kwargs)
    return module


def compile_regions_fsdp2(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """Compile the same regions as `compile_regions`, in place (`nn.Module.compile`); returns `module`.

    In place, `nn.Module.__call__` still runs each block's hooks (FSDP2's
    all-gather and reshard, DeepSpeed's) outside the compiled code, the state
    dict keys do not change and nothing has to be unwrapped. Unlike the
    peer's (`nn.Module.compile`, a no-op there), blocks of torch's own
    classes are compiled too (`compile_in_place`), with their hooks inside.

    Example:
        >>> net = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(2)]))
        >>> compile_regions_fsdp2(net, backend="eager")[0][1]._compiled_call_impl is not None
        True
    """
    if is_repeated_blocks(module):
        for block in cast(nn.ModuleList, module):
            compile_in_place(block, **compile_kwargs)
    elif has_repeated_blocks(module):
        for child in module.children():
            compile_regions_fsdp2(child, **compile_kwargs)
    else:
        compile_in_place(module, **compile_kwargs)
    return module


def compile_regions_deepspeed(module: nn.Module, **compile_kwargs: Any) -> None:
    """`compile_regions_fsdp2` for a DeepSpeed engine's `engine.module` (in place; returns None, as the peer's).

    Example:
        >>> net = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(2)])
        >>> compile_regions_deepspeed(net, backend="eager")
        >>> net[0]._compiled_call_impl is not None
        True
    """
    compile_regions_fsdp2(module, **compile_kwargs)
