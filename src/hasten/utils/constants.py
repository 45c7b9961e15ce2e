"""File names of checkpoints and weights, and the option lists libraries read (``accelerate.utils.constants``).

Example:
    >>> from hasten.utils.constants import SAFE_WEIGHTS_NAME, FSDP_SHARDING_STRATEGY
    >>> SAFE_WEIGHTS_NAME, FSDP_SHARDING_STRATEGY[0]
    ('model.safetensors', 'FULL_SHARD')
"""

from ..core.accelerators import DEVICE_VISIBLE_DEVICES_ENV_VARS, TORCH_DISTRIBUTED_BACKENDS
from ..core.availability import (BETA_SP_AVAILABLE_DEEPSPEED_VERSION, BETA_TP_AVAILABLE_TRANSFORMERS_VERSION,
                                 MINIMUM_VERSIONS, STR_OPERATION_TO_FUNC)
from ..big_modeling.casting import SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING
from ..checkpointing.constants import *  # noqa: F401,F403 - the names are the point
from ..checkpointing.constants import __all__ as _names
from ..launch.accelerate_config_file import (SAGEMAKER_PARALLEL_EC2_INSTANCES, SAGEMAKER_PYTHON_VERSION, SAGEMAKER_PYTORCH_VERSION,
                                  SAGEMAKER_TRANSFORMERS_VERSION)
from ..cli.launcher_env import DEEPSPEED_MULTINODE_LAUNCHERS, TORCH_LAUNCH_PARAMS
from ..options.configuration import TORCH_DYNAMO_MODES
from ..options.enums import CUDA_DISTRIBUTED_TYPES, TORCH_DISTRIBUTED_OPERATION_TYPES
from ..options.kwargs import PROFILE_PATTERN_NAME
from ..strategies.fsdp.checkpoint import MODEL_DIR as FSDP_MODEL_NAME
from ..strategies.fsdp.plugin import (FSDP2_STATE_DICT_TYPE, FSDP_AUTO_WRAP_POLICY, FSDP_BACKWARD_PREFETCH,
                                      FSDP_SHARDING_STRATEGY, FSDP_STATE_DICT_TYPE)

__all__ = list(_names) + ["FSDP_SHARDING_STRATEGY", "FSDP_AUTO_WRAP_POLICY", "FSDP_BACKWARD_PREFETCH",
                          "FSDP_STATE_DICT_TYPE", "FSDP_MODEL_NAME", "TORCH_DYNAMO_MODES", "STR_OPERATION_TO_FUNC",
                          "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING", "DEEPSPEED_MULTINODE_LAUNCHERS",
                          "SAGEMAKER_PYTORCH_VERSION", "SAGEMAKER_PYTHON_VERSION", "SAGEMAKER_TRANSFORMERS_VERSION",
                          "SAGEMAKER_PARALLEL_EC2_INSTANCES", "FSDP2_STATE_DICT_TYPE", "TORCH_LAUNCH_PARAMS",
                          "CUDA_DISTRIBUTED_TYPES", "TORCH_DISTRIBUTED_OPERATION_TYPES", "PROFILE_PATTERN_NAME",
                          "TORCH_DISTRIBUTED_BACKENDS", "DEVICE_VISIBLE_DEVICES_ENV_VARS", *MINIMUM_VERSIONS]
