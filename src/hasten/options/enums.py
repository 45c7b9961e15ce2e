"""The option enums with the peer's names and values (`DistributedType`, `PrecisionType`, ...).

Example:
    >>> from hasten.options.enums import PrecisionType
    >>> PrecisionType("bf16") is PrecisionType.BF16
    True
"""

from __future__ import annotations

import enum

__all__ = [
    "EnumWithContains", "BaseEnum", "DistributedType", "ComputeEnvironment", "SageMakerDistributedType",
    "FP8BackendType", "CustomDtype", "PrecisionType", "RNGType", "DDPCommunicationHookType", "DynamoBackend",
    "CUDA_DISTRIBUTED_TYPES", "TORCH_DISTRIBUTED_OPERATION_TYPES",
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


# Accelerate's groupings of the kinds above (``accelerate.utils.constants``), as the values' strings: the kinds
# that run on CUDA devices (with its "TP", a kind Accelerate 1.16 no longer has), and the kinds whose collectives
# go through torch.distributed.
CUDA_DISTRIBUTED_TYPES = ["DEEPSPEED", "MULTI_GPU", "FSDP", "MEGATRON_LM", "TP"]
TORCH_DISTRIBUTED_OPERATION_TYPES = CUDA_DISTRIBUTED_TYPES + [
    "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU", "MULTI_CPU", "MULTI_HPU", "MULTI_NEURON",
]


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
    """fp8 libraries by the peer's names (`Accelerator.fp8_backend`; hasten drives AO, torchao).

    Example:
        >>> FP8BackendType("AO").name
        'AO'
    """

    NO = "NO"
    TE = "TE"
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
