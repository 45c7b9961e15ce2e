"""Accelerate's DeepSpeed helper functions (``accelerate.utils.deepspeed`` / ``.imports`` / ``.operations`` names).

`get_active_deepspeed_plugin` and `deepspeed_required` ask the run's
`AcceleratorState`; `GatheredParameters` gathers ZeRO-3 partitioned
parameters (a no-op otherwise); `map_pytorch_optim_to_deepspeed` gives the
DeepSpeed CPU optimizer matching a torch (or bitsandbytes) optimizer, for
optimizer offload. DeepSpeed itself is imported only when one is used.

Example:
    >>> from hasten import Accelerator
    >>> get_active_deepspeed_plugin(Accelerator(cpu=True).state)
    Traceback (most recent call last):
    ...
    ValueError: no DeepSpeedPlugin is active: the Accelerator is not configured for deepspeed; create it with deepspeed_plugin=DeepSpeedPlugin(...) or launch with --use_deepspeed before calling this.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import torch

from ...options import DistributedType
from ...runtime.accelerator_state import AcceleratorState, is_initialized

__all__ = ["get_active_deepspeed_plugin", "deepspeed_required", "GatheredParameters", "map_pytorch_optim_to_deepspeed",
           "deepspeed_cpu_optimizer_for"]


def get_active_deepspeed_plugin(state: Any) -> Any:
    """The DeepSpeedPlugin the run uses (of several named ones, the selected one); ValueError without DeepSpeed.

    Example:
        >>> from types import SimpleNamespace
        >>> plugin = object()
        >>> state = SimpleNamespace(distributed_type=DistributedType.DEEPSPEED, deepspeed_plugins=plugin)
        >>> get_active_deepspeed_plugin(state) is plugin
        True
    """
    if state.distributed_type != DistributedType.DEEPSPEED:
        raise ValueError("no DeepSpeedPlugin is active: the Accelerator is not configured for deepspeed; create it with "
                         "deepspeed_plugin=DeepSpeedPlugin(...) or launch with --use_deepspeed before calling this.")
    plugins = getattr(state, "deepspeed_plugins", None)
    if not isinstance(plugins, dict):
        return plugins
    # Several named plugins: the selected one (`accelerator.state.select_deepspeed_plugin(name)`).
    active = next((plugin for plugin in plugins.values() if getattr(plugin, "selected", False)), None)
    if active is None:
        raise ValueError(f"none of the named DeepSpeed plugins {sorted(plugins)} is selected; select one with "
                         "accelerator.state.select_deepspeed_plugin(name).")
    return active


def deepspeed_required(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: once an Accelerator exists, calling `func` in a run not configured for DeepSpeed raises ValueError.

    Example:
        >>> @deepspeed_required
        ... def zero_stage(): return 3
        >>> zero_stage()  # no Accelerator yet: nothing to check
        3
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if is_initialized() and AcceleratorState().distributed_type != DistributedType.DEEPSPEED:
            raise ValueError(f"{func.__name__} needs DeepSpeed, which is not enabled: configure the Accelerator for "
                             "deepspeed (deepspeed_plugin=... or --use_deepspeed) before calling it.")
        return func(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def GatheredParameters(params: Any, modifier_rank: int | None = None, fwd_module: Any = None,  # noqa: N802 - the peer's name
                       enabled: bool = True) -> Iterator[None]:
    """Inside the `with`, ZeRO-3 partitioned `params` are whole on every process (DeepSpeed's `GatheredParameters`).

    As in Accelerate it does nothing unless the run is DeepSpeed with ZeRO-3
    initialisation on (`zero3_init_flag`); `modifier_rank` is the process
    whose changes are kept when the parameters are partitioned again.

    Example:
        >>> import torch
        >>> weight = torch.nn.Parameter(torch.ones(2))
        >>> with GatheredParameters([weight]):  # no DeepSpeed here: a plain block
        ...     weight.shape
        torch.Size([2])
    """
    state = AcceleratorState()
    plugin = state.deepspeed_plugin
    zero3 = state.distributed_type == DistributedType.DEEPSPEED and (plugin is None or plugin.is_zero3_init_enabled())
    if not zero3:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank, fwd_module=fwd_module, enabled=enabled):
        yield


def _bitsandbytes_kind(optimizer: Any) -> tuple[str, bool] | None:
    """(class name without "32bit", whether it keeps 32-bit state) of a bitsandbytes optimizer; None for others.

    Read from the class and its arguments, so bitsandbytes is never imported here.
    """
    cls = type(optimizer)
    if not cls.__module__.startswith("bitsandbytes"):
        return None
    name = cls.__name__.removesuffix("32bit")
    bits = getattr(optimizer, "optim_bits", None)
    if bits is None:
        bits = getattr(getattr(optimizer, "args", None), "optim_bits", None)
    return name, cls.__name__.endswith("32bit") or bits == 32


def deepspeed_cpu_optimizer_for(optimizer: Any) -> tuple[str, str, dict[str, Any]]:
    """(module, class, extra arguments) of the DeepSpeed CPU optimizer matching `optimizer`, by Accelerate's rules.

    Adagrad (torch's, or bitsandbytes' 32-bit) -> DeepSpeedCPUAdagrad;
    bitsandbytes' 32-bit Lion -> DeepSpeedCPULion; anything else ->
    DeepSpeedCPUAdam, in AdamW mode for torch's AdamW (or bitsandbytes'
    32-bit AdamW). The learning rate and weight decay come from the
    optimizer's defaults.

    Example:
        >>> params = [torch.nn.Parameter(torch.ones(1))]
        >>> deepspeed_cpu_optimizer_for(torch.optim.AdamW(params, lr=0.1))
        ('deepspeed.ops.adam', 'DeepSpeedCPUAdam', {'lr': 0.1, 'weight_decay': 0.01, 'adamw_mode': True})
    """
    defaults = {key: value for key, value in optimizer.defaults.items() if key in ("lr", "weight_decay")}
    bnb = _bitsandbytes_kind(optimizer)
    if isinstance(optimizer, torch.optim.Adagrad) or (bnb is not None and bnb == ("Adagrad", True)):
        return "deepspeed.ops.adagrad", "DeepSpeedCPUAdagrad", defaults
    if bnb is not None and bnb == ("Lion", True):
        return "deepspeed.ops.lion", "DeepSpeedCPULion", defaults
    adamw = isinstance(optimizer, torch.optim.AdamW) or (bnb is not None and bnb == ("AdamW", True))
    return "deepspeed.ops.adam", "DeepSpeedCPUAdam", {**defaults, "adamw_mode": adamw}


def map_pytorch_optim_to_deepspeed(optimizer: torch.optim.Optimizer) -> Any:
    """A DeepSpeed CPU optimizer over `optimizer`'s parameter groups (see `deepspeed_cpu_optimizer_for`).

    Needs DeepSpeed (its CPU optimizers are built on first use).

    Example:
        >>> callable(map_pytorch_optim_to_deepspeed)
        True
    """
    import importlib

    from .config import require_deepspeed

    require_deepspeed()
    module, name, arguments = deepspeed_cpu_optimizer_for(optimizer)
    return getattr(importlib.import_module(module), name)(optimizer.param_groups, **arguments)
