"""Option objects accepted by `Accelerator` (the names users know from the peer API), one concept a module.

- `enums.py`: `DistributedType`, `PrecisionType`, `DynamoBackend`, ... (the peer's enums);
- `kwargs.py`: the keyword-argument handlers (`DistributedDataParallelKwargs`, `GradScalerKwargs`, ...);
- `configuration.py`: `DataLoaderConfiguration`, `GradientAccumulationPlugin`, `TorchDynamoPlugin`.

The peer's own path for them is `hasten.utils.dataclasses`.

Example:
    >>> from hasten.options import DistributedType
    >>> DistributedType.MULTI_CPU == "MULTI_CPU"
    True
"""

from .configuration import DataLoaderConfiguration, GradientAccumulationPlugin, TorchDynamoPlugin
from .enums import (
    BaseEnum,
    ComputeEnvironment,
    CustomDtype,
    DDPCommunicationHookType,
    DistributedType,
    DynamoBackend,
    EnumWithContains,
    FP8BackendType,
    PrecisionType,
    RNGType,
    SageMakerDistributedType,
)
from .kwargs import (
    AutocastKwargs,
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProfileKwargs,
    split_kwargs_handlers,
)

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
