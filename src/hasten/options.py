"""Option objects accepted by `Accelerator` (the names users know from the peer API)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
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
    "AutocastKwargs",
    "DDPCommunicationHookType",
    "DynamoBackend",
    "TorchDynamoPlugin",
    "KwargsHandler",
    "PrecisionType",
    "RNGType",
    "BaseEnum",
    "EnumWithContains",
    "ComputeEnvironment",
    "SageMakerDistributedType",
    "FP8BackendType",
    "CustomDtype",
]


class EnumWithContains(enum.EnumMeta):
    """Enum metaclass for which `value in Enum` asks whether `value` names a member's value.

    Example:
        >>> "bf16" in PrecisionType, "fp4" in PrecisionType
        (True, False)
    """

    def __contains__(cls, item: object) -> bool:
        try:
            cls(item)
        except ValueError:
            return False
        return True


class BaseEnum(enum.Enum, metaclass=EnumWithContains):
    """An enum whose `str()` is its value, with `list()` of every value (the peer's base for option enums).

    Example:
        >>> str(PrecisionType.BF16), PrecisionType.list()
        ('bf16', ['no', 'fp8', 'fp16', 'bf16'])
    """

    def __str__(self) -> str:
        return self.value

    @classmethod
    def list(cls) -> list[str]:
        return [str(member) for member in cls]


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
    MULTI_NEURON = "MULTI_NEURON"


class ComputeEnvironment(str, enum.Enum):
    """Where the run's machines come from (a config file's `compute_environment`); hasten runs LOCAL_MACHINE only.

    Example:
        >>> ComputeEnvironment("LOCAL_MACHINE").name
        'LOCAL_MACHINE'
    """

    LOCAL_MACHINE = "LOCAL_MACHINE"
    AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"


class SageMakerDistributedType(str, enum.Enum):
    """SageMaker's data/model parallel libraries (kept for scripts that name them; hasten launches no SageMaker job).

    Example:
        >>> SageMakerDistributedType.NO == "NO"
        True
    """

    NO = "NO"
    DATA_PARALLEL = "DATA_PARALLEL"
    MODEL_PARALLEL = "MODEL_PARALLEL"


class FP8BackendType(str, enum.Enum):
    """fp8 libraries by the peer's names (hasten does not train in fp8 yet: `mixed_precision="fp8"` is refused).

    Example:
        >>> FP8BackendType("AO").name
        'AO'
    """

    NO = "NO"
    TE = "TE"
    MSAMP = "MSAMP"
    AO = "AO"


class CustomDtype(enum.Enum):
    """Sizes below one byte that `infer_auto_device_map`'s `special_dtypes` may name.

    Example:
        >>> CustomDtype.INT4.value
        'int4'
    """

    FP8 = "fp8"
    INT4 = "int4"
    INT2 = "int2"


class _KwargsHandler:
    """A dataclass whose non-default fields become keyword arguments.

    Example:
        >>> GradScalerKwargs(growth_interval=10).to_kwargs()
        {'growth_interval': 10}
    """

    def to_kwargs(self) -> dict[str, Any]:
        default = type(self)()
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(default, f.name)}


KwargsHandler = _KwargsHandler  # the peer's public name for the base class


class PrecisionType(str, BaseEnum):
    """The mixed precision choices, as an enum (the strings are what `mixed_precision` takes).

    Example:
        >>> PrecisionType.BF16 == "bf16"
        True
    """

    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


class RNGType(str, BaseEnum):
    """Random number generators a script may ask to synchronise (`synchronize_rng_states`).

    Example:
        >>> RNGType("torch").value
        'torch'
    """

    TORCH = "torch"
    CUDA = "cuda"
    MLU = "mlu"
    SDAA = "sdaa"
    MUSA = "musa"
    NPU = "npu"
    XLA = "xla"
    XPU = "xpu"
    HPU = "hpu"
    NEURON = "neuron"
    GENERATOR = "generator"


class DDPCommunicationHookType(str, BaseEnum):
    """torch DDP communication hooks that `DistributedDataParallelKwargs(comm_hook=...)` registers.

    Example:
        >>> DDPCommunicationHookType("power_sgd").name
        'POWER_SGD'
    """

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


class DynamoBackend(str, BaseEnum):
    """`torch.compile` backends by the peer's names (`NO` = do not compile).

    Example:
        >>> DynamoBackend("INDUCTOR").value.lower()
        'inductor'
    """

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    IPEX = "IPEX"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"
    NEURON = "NEURON"


@dataclass
class TorchDynamoPlugin(_KwargsHandler):
    """`torch.compile` settings for prepared models (`Accelerator(dynamo_backend=...)` or `dynamo_plugin=...`).

    `backend` is a `DynamoBackend` or its name in any case ("inductor",
    "eager", ...); "no" turns compilation off. The model is compiled in place
    (`nn.Module.compile`), so its type, its state dict keys and DDP's
    `no_sync` stay as they were.

    Example:
        >>> TorchDynamoPlugin(backend="eager").to_kwargs()
        {'backend': 'eager'}
    """

    backend: DynamoBackend | str | None = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    options: Any = None
    disable: bool = False
    use_regional_compilation: bool | None = None

    def __post_init__(self) -> None:
        if self.backend is None:
            self.backend = DynamoBackend.NO
        try:
            self.backend = DynamoBackend(str(getattr(self.backend, "value", self.backend)).upper())
        except ValueError:
            names = ", ".join(b.value.lower() for b in DynamoBackend)
            raise ValueError(f"TorchDynamoPlugin got backend={self.backend!r}; use one of {names}.") from None
        if self.use_regional_compilation:
            raise NotImplementedError("TorchDynamoPlugin(use_regional_compilation=True) is not built in hasten; "
                                      "drop it to compile the whole model.")

    @property
    def enabled(self) -> bool:
        """True when prepared models are compiled."""
        return self.backend is not DynamoBackend.NO and not self.disable

    def to_kwargs(self) -> dict[str, Any]:
        """The keyword arguments for `torch.compile` (only those set)."""
        kwargs: dict[str, Any] = {"backend": self.backend.value.lower()}
        for name in ("mode", "fullgraph", "dynamic", "options"):
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        return kwargs


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
class DataLoaderConfiguration:
    """How `prepare` shards data loaders (see `hasten.data`).

    Example:
        >>> DataLoaderConfiguration(split_batches=True).even_batches
        True
    """

    split_batches: bool = False
    # True: process 0 alone reads each batch and sends every process its rows. None (Accelerate's default):
    # True for an iterable dataset whose batches are put on the device, False otherwise.
    dispatch_batches: bool | None = None
    even_batches: bool = True
    # Shuffle with the seed data_seed + epoch (as Accelerate's SeedableRandomSampler) instead of torch's RandomSampler
    # draws; either way every process sees the same order and a resume continues it exactly.
    use_seedable_sampler: bool = False
    # The seed of the seedable sampler (default: torch's initial seed); used only with use_seedable_sampler or keyed_shuffle.
    data_seed: int | None = None
    non_blocking: bool = False
    # load_state also restores each prepared loader's position: the next pass yields the rest of the epoch
    use_stateful_dataloader: bool = False
    # hasten's opt-in: shuffle with its keyed O(1)-memory order (seed data_seed, else torch's initial seed). It starts a
    # 1e9-sample loader at once but visits samples in another order than Accelerate. Datasets over 2**27 samples use it
    # anyway (a permutation would not fit comfortably in memory); the log says so once.
    keyed_shuffle: bool = False


@dataclass
class GradientAccumulationPlugin:
    """Gradient accumulation settings.

    Example:
        >>> GradientAccumulationPlugin(num_steps=4).sync_with_dataloader
        True
    """

    num_steps: int = 1
    adjust_scheduler: bool = True  # as in Accelerate, only its non-default value reaches GradientState.adjust_scheduler
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

        hooks = {
            DDPCommunicationHookType.FP16: default_hooks.fp16_compress_hook,
            DDPCommunicationHookType.BF16: default_hooks.bf16_compress_hook,
            DDPCommunicationHookType.POWER_SGD: powerSGD_hook.powerSGD_hook,
            DDPCommunicationHookType.BATCHED_POWER_SGD: powerSGD_hook.batched_powerSGD_hook,
        }
        wrappers = {DDPCommunicationHookType.FP16: default_hooks.fp16_compress_wrapper,
                    DDPCommunicationHookType.BF16: default_hooks.bf16_compress_wrapper}
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

