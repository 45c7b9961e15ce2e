"""File names of checkpoints and weights, and the option lists libraries read (``accelerate.utils.constants``).

Example:
    >>> from hasten.utils.constants import SAFE_WEIGHTS_NAME, FSDP_SHARDING_STRATEGY
    >>> SAFE_WEIGHTS_NAME, FSDP_SHARDING_STRATEGY[0]
    ('model.safetensors', 'FULL_SHARD')
"""

from ..core.availability import STR_OPERATION_TO_FUNC
from ..big_modeling.casting import SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING
from ..checkpointing.constants import *  # noqa: F401,F403 - the names are the point
from ..checkpointing.constants import __all__ as _names
from ..options.configuration import TORCH_DYNAMO_MODES
from ..strategies.fsdp.checkpoint import MODEL_DIR as FSDP_MODEL_NAME
from ..strategies.fsdp.plugin import (FSDP_AUTO_WRAP_POLICY, FSDP_BACKWARD_PREFETCH, FSDP_SHARDING_STRATEGY,
                                      FSDP_STATE_DICT_TYPE)

__all__ = list(_names) + ["FSDP_SHARDING_STRATEGY", "FSDP_AUTO_WRAP_POLICY", "FSDP_BACKWARD_PREFETCH",
                          "FSDP_STATE_DICT_TYPE", "FSDP_MODEL_NAME", "TORCH_DYNAMO_MODES", "STR_OPERATION_TO_FUNC",
                          "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING"]
