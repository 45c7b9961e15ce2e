"""Option classes under the peer's path (``accelerate.utils.dataclasses``).

They are defined in `hasten.options` (and the engine plugins in their own
modules, imported on first use).

Example:
    >>> from hasten.utils.dataclasses import AutocastKwargs, DDPCommunicationHookType
    >>> AutocastKwargs(enabled=False).enabled
    False
"""

from __future__ import annotations

import importlib
from typing import Any

from ..checkpointing.project import ProjectConfiguration
from ..options import (
    AutocastKwargs,
    BaseEnum,
    ComputeEnvironment,
    CustomDtype,
    EnumWithContains,
    FP8BackendType,
    SageMakerDistributedType,
    DataLoaderConfiguration,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    DistributedType,
    DynamoBackend,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    PrecisionType,
    ProfileKwargs,
    RNGType,
    TorchDynamoPlugin,
)
from ..tracking.base import LoggerType
from .unavailable import (
    AORecipeKwargs,
    DeepSpeedSequenceParallelConfig,
    FP8RecipeKwargs,
    MegatronLMPlugin,
    MSAMPRecipeKwargs,
    TERecipeKwargs,
)

__all__ = [
    "AutocastKwargs", "DataLoaderConfiguration", "DDPCommunicationHookType", "DistributedDataParallelKwargs",
    "DistributedType", "DynamoBackend", "GradientAccumulationPlugin", "GradScalerKwargs", "InitProcessGroupKwargs",
    "KwargsHandler", "LoggerType", "PrecisionType", "ProfileKwargs", "ProjectConfiguration", "RNGType",
    "TorchDynamoPlugin", "FullyShardedDataParallelPlugin", "DeepSpeedPlugin", "BaseEnum", "ComputeEnvironment",
    "CustomDtype", "EnumWithContains", "FP8BackendType", "SageMakerDistributedType", "AORecipeKwargs",
    "DeepSpeedSequenceParallelConfig", "FP8RecipeKwargs", "MegatronLMPlugin", "MSAMPRecipeKwargs", "TERecipeKwargs",
]

_LAZY = {"FullyShardedDataParallelPlugin": "..fsdp_plugin", "DeepSpeedPlugin": "..deepspeed_plugin"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hasten.utils.dataclasses' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __package__), name)
    globals()[name] = value
    return value
