"""Keyword-argument handlers: dataclasses whose non-default fields become a torch call's arguments.

`Accelerator(kwargs_handlers=[...])` takes one of each (`split_kwargs_handlers`).

Example:
    >>> from hasten.options.kwargs import DistributedDataParallelKwargs
    >>> DistributedDataParallelKwargs(bucket_cap_mb=50).to_kwargs()
    {'bucket_cap_mb': 50}
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any, Callable, cast

from .enums import DDPCommunicationHookType

__all__ = [
    "KwargsHandler", "AutocastKwargs", "DistributedDataParallelKwargs", "InitProcessGroupKwargs", "GradScalerKwargs",
    "ProfileKwargs", "split_kwargs_handlers", "PROFILE_PATTERN_NAME",
]

# The file each process writes its trace to under `ProfileKwargs.output_trace_dir` (suffix: the process index).
PROFILE_PATTERN_NAME = "profile_{suffix}.json"


class _KwargsHandler:
    """A dataclass whose non-default fields become keyword arguments.

    Example:
        >>> GradScalerKwargs(growth_interval=10).to_kwargs()
        {'growth_interval': 10}
    """

    def to_dict(self) -> dict[str, Any]:
        """Every field, copied (Accelerate's `KwargsHandler.to_dict`)."""
        return copy.deepcopy(self.__dict__)

    def to_kwargs(self) -> dict[str, Any]:
        default = type(self)()
        return {f.name: getattr(self, f.name) for f in fields(cast(Any, self)) if getattr(self, f.name) != getattr(default, f.name)}


KwargsHandler = _KwargsHandler  # the peer's public name for the base class


@dataclass
class AutocastKwargs(_KwargsHandler):
    """Settings of the autocast block `Accelerator.autocast(autocast_handler)` opens (or the default one, via kwargs_handlers).

    Example:
        >>> AutocastKwargs(enabled=False).to_kwargs()
        {'enabled': False}
    """

    enabled: bool = True
    cache_enabled: bool | None = None


@dataclass
class DistributedDataParallelKwargs(_KwargsHandler):
    """Arguments passed on to `torch.nn.parallel.DistributedDataParallel`.

    Example:
        >>> DistributedDataParallelKwargs(find_unused_parameters=True).to_kwargs()
        {'find_unused_parameters': True}
    """

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    # A torch DDP communication hook (gradient compression), registered on every model DDP wraps.
    comm_hook: DDPCommunicationHookType | str = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType | str = DDPCommunicationHookType.NO  # FP16 / BF16 around POWER_SGD
    comm_state_option: dict[str, Any] = field(default_factory=dict)  # PowerSGDState arguments

    def __post_init__(self) -> None:
        self.comm_hook = DDPCommunicationHookType(self.comm_hook)
        self.comm_wrapper = DDPCommunicationHookType(self.comm_wrapper)
        if self.comm_wrapper not in (DDPCommunicationHookType.NO, DDPCommunicationHookType.FP16, DDPCommunicationHookType.BF16):
            raise ValueError(f"comm_wrapper={self.comm_wrapper.value!r} is not a wrapper; use 'fp16' or 'bf16'.")
        if self.comm_wrapper is not DDPCommunicationHookType.NO and self.comm_hook not in (
                DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BATCHED_POWER_SGD):
            raise ValueError("comm_wrapper compresses PowerSGD's communication; set comm_hook='power_sgd' or "
                             "'batched_power_sgd' too, or drop comm_wrapper.")
        if self.comm_state_option and self.comm_hook not in (
                DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BATCHED_POWER_SGD):
            raise ValueError("comm_state_option configures PowerSGD; set comm_hook='power_sgd' or drop comm_state_option.")

    def to_kwargs(self) -> dict[str, Any]:
        """The `DistributedDataParallel` arguments (the hook settings are applied by `register_comm_hook`)."""
        hook_fields = ("comm_hook", "comm_wrapper", "comm_state_option")
        return {k: v for k, v in super().to_kwargs().items() if k not in hook_fields}

    def register_comm_hook(self, model: Any) -> None:
        """Register the configured communication hook on a `DistributedDataParallel` model (nothing for NO).

        Example:
            >>> DistributedDataParallelKwargs().register_comm_hook(None)  # no hook configured: nothing to do
        """
        if self.comm_hook is DDPCommunicationHookType.NO:
            return
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        hooks: dict[DDPCommunicationHookType | str, Callable[..., Any]] = {
            DDPCommunicationHookType.FP16: default_hooks.fp16_compress_hook,
            DDPCommunicationHookType.BF16: default_hooks.bf16_compress_hook,
            DDPCommunicationHookType.POWER_SGD: powerSGD_hook.powerSGD_hook,
            DDPCommunicationHookType.BATCHED_POWER_SGD: powerSGD_hook.batched_powerSGD_hook,
        }
        wrappers: dict[DDPCommunicationHookType | str, Callable[..., Any]] = {
            DDPCommunicationHookType.FP16: default_hooks.fp16_compress_wrapper,
            DDPCommunicationHookType.BF16: default_hooks.bf16_compress_wrapper,
        }
        hook = hooks[self.comm_hook]
        if self.comm_wrapper in wrappers:
            hook = wrappers[self.comm_wrapper](hook)
        state = None
        if self.comm_hook in (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BATCHED_POWER_SGD):
            state = powerSGD_hook.PowerSGDState(process_group=None, **self.comm_state_option)
        model.register_comm_hook(state=state, hook=hook)


@dataclass
class InitProcessGroupKwargs(_KwargsHandler):
    """Arguments for creating the process group (backend, timeout).

    Example:
        >>> InitProcessGroupKwargs(timeout=timedelta(seconds=60)).to_kwargs()
        {'timeout': datetime.timedelta(seconds=60)}
    """

    backend: str | None = None
    init_method: str | None = None
    timeout: timedelta | None = None


@dataclass
class GradScalerKwargs(_KwargsHandler):
    """Arguments for the fp16 `torch.amp.GradScaler`.

    Example:
        >>> GradScalerKwargs(init_scale=1024.0).to_kwargs()
        {'init_scale': 1024.0}
    """

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class ProfileKwargs(_KwargsHandler):
    """Settings of `Accelerator.profile()` (torch.profiler underneath).

    `activities`: ``["cpu", "cuda", ...]`` (default: CPU, plus CUDA when
    present); `schedule_option`: ``{"wait", "warmup", "active", "repeat",
    "skip_first"}`` for `torch.profiler.schedule`; `output_trace_dir`: where
    each process writes ``profile_<rank>.json`` (a Chrome trace).

    Example:
        >>> ProfileKwargs(record_shapes=True, output_trace_dir="traces").to_kwargs()
        {'record_shapes': True, 'output_trace_dir': 'traces'}
    """

    activities: list[str] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Any = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None

    def build(self) -> Any:
        """The `torch.profiler.profile` these settings describe."""
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        names = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU", "mtia": "MTIA", "hpu": "HPU"}
        wanted = self.activities or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
        unknown = [a for a in wanted if a not in names or not hasattr(ProfilerActivity, names[a])]
        if unknown:
            raise ValueError(f"ProfileKwargs(activities=...) got {unknown}; use some of {sorted(names)}.")
        return profile(
            activities=[getattr(ProfilerActivity, names[a]) for a in wanted],
            schedule=schedule(**self.schedule_option) if self.schedule_option else None,
            on_trace_ready=self.on_trace_ready,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_flops=self.with_flops,
            with_modules=self.with_modules,
        )


def split_kwargs_handlers(handlers: list[Any] | None) -> dict[type, Any]:
    """Index handlers by type, refusing duplicates and unknown objects with one sentence.

    Example:
        >>> [kind.__name__ for kind in split_kwargs_handlers([GradScalerKwargs()])]
        ['GradScalerKwargs']
    """
    known = (DistributedDataParallelKwargs, InitProcessGroupKwargs, GradScalerKwargs, ProfileKwargs, AutocastKwargs)
    found: dict[type, Any] = {}
    for handler in handlers or []:
        kind = type(handler)
        if kind not in known:
            names = ", ".join(k.__name__ for k in known)
            raise ValueError(f"kwargs_handlers got a {kind.__name__}; it accepts only {names}.")
        if kind in found:
            raise ValueError(f"kwargs_handlers got two {kind.__name__} objects; pass one.")
        found[kind] = handler
    return found
