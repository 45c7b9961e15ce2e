"""Option classes under the peer's path (``accelerate.utils.dataclasses``).

They are defined in `hasten.options` (the fp8 recipes in `hasten.fp8.recipes`) and, for the engine plugins, in
`hasten.strategies.fsdp.plugin` / `hasten.strategies.deepspeed.plugin`.

Example:
    >>> from hasten.utils.dataclasses import AutocastKwargs, DDPCommunicationHookType
    >>> AutocastKwargs(enabled=False).enabled
    False
"""

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
from ..strategies.deepspeed.plugin import DeepSpeedPlugin
from ..strategies.deepspeed.ulysses import DeepSpeedSequenceParallelConfig
from ..strategies.fsdp.plugin import FullyShardedDataParallelPlugin
from ..strategies.parallel.mesh import TorchTensorParallelConfig
from ..strategies.parallel.tp_size import TorchTensorParallelPlugin
from ..strategies.parallel.context_config import TorchContextParallelConfig
from ..tracking.base import LoggerType
from ..fp8.recipes import AORecipeKwargs, TERecipeKwargs
from ..core.unavailable import (MegatronLMPlugin, add_model_config_to_megatron_parser, parse_bert_config,
                                parse_glm4_moe_config, parse_gpt2_config, parse_llama_config, parse_t5_config)
from ..big_modeling.bnb import BnbQuantizationConfig
from ..runtime.modules import get_module_class_from_name
from ..runtime.operations import TensorInformation

__all__ = [
    "AutocastKwargs", "DataLoaderConfiguration", "DDPCommunicationHookType", "DistributedDataParallelKwargs",
    "DistributedType", "DynamoBackend", "GradientAccumulationPlugin", "GradScalerKwargs", "InitProcessGroupKwargs",
    "KwargsHandler", "LoggerType", "PrecisionType", "ProfileKwargs", "ProjectConfiguration", "RNGType",
    "TorchDynamoPlugin", "FullyShardedDataParallelPlugin", "DeepSpeedPlugin", "BaseEnum", "ComputeEnvironment",
    "CustomDtype", "EnumWithContains", "FP8BackendType", "SageMakerDistributedType", "AORecipeKwargs",
    "DeepSpeedSequenceParallelConfig", "MegatronLMPlugin", "TERecipeKwargs",
    "TorchTensorParallelConfig",
    "TorchTensorParallelPlugin",
    "TorchContextParallelConfig",
    "TensorInformation",
    "BnbQuantizationConfig", "get_module_class_from_name", "add_model_config_to_megatron_parser", "parse_bert_config",
    "parse_gpt2_config", "parse_t5_config", "parse_llama_config", "parse_glm4_moe_config",
]
