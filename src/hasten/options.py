"""Option objects accepted by `Accelerator` (the names users know from the peer API)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any

__all__ = [
    "DistributedType",
    "DataLoaderConfiguration",
    "GradientAccumulationPlugin",
    "DistributedDataParallelKwargs",
    "InitProcessGroupKwargs",
    "GradScalerKwargs",
    "ProfileKwargs",
]


class DistributedType(str, enum.Enum):
    """The kind of run, for user code that branches on it.

    Example:
        >>> DistributedType.MULTI_CPU == "MULTI_CPU"
        True
    """

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_MPS = "MULTI_MPS"
    FSDP = "FSDP"
    DEEPSPEED = "DEEPSPEED"
    # Kinds hasten never runs (it has no TPU, Megatron-LM or vendor-accelerator backend); they exist so
    # scripts that compare against them keep working, and always compare unequal to this run's type.
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    MULTI_HPU = "MULTI_HPU"


class _KwargsHandler:
    """A dataclass whose non-default fields become keyword arguments."""

    def to_kwargs(self) -> dict[str, Any]:
        default = type(self)()
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(default, f.name)}


@dataclass
class DataLoaderConfiguration:
    """How `prepare` shards data loaders (see `hasten.data`).

    Example:
        >>> DataLoaderConfiguration(split_batches=True).even_batches
        True
    """

    split_batches: bool = False
    even_batches: bool = True
    non_blocking: bool = False
    # load_state also restores each prepared loader's position: the next pass yields the rest of the epoch
    use_stateful_dataloader: bool = False


@dataclass
class GradientAccumulationPlugin:
    """Gradient accumulation settings.

    Example:
        >>> GradientAccumulationPlugin(num_steps=4).sync_with_dataloader
        True
    """

    num_steps: int = 1
    adjust_scheduler: bool = True  # accepted for compatibility: the scheduler steps once per optimizer step
    sync_with_dataloader: bool = True
    # Synchronise (all-reduce / reduce-scatter) gradients on every batch, not only on the optimizer step:
    # more communication, but under FSDP no full-size unsharded gradient is kept between batches.
    sync_each_batch: bool = False


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
    """Index handlers by type, refusing duplicates and unknown objects with one sentence."""
    known = (DistributedDataParallelKwargs, InitProcessGroupKwargs, GradScalerKwargs, ProfileKwargs)
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

