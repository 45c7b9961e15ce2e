"""File names of checkpoints and weights, and the option lists libraries read (``accelerate.utils.constants``).

Example:
    >>> from hasten.utils.constants import SAFE_WEIGHTS_NAME, FSDP_SHARDING_STRATEGY
    >>> SAFE_WEIGHTS_NAME, FSDP_SHARDING_STRATEGY[0]
    ('model.safetensors', 'FULL_SHARD')
"""

import operator as _op

from ..checkpointing.constants import *  # noqa: F401,F403 - the names are the point
from ..checkpointing.constants import __all__ as _names

# The choices of Accelerate's FSDP options, by the names its config files use (transformers validates against them).
FSDP_SHARDING_STRATEGY = ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"]
FSDP_AUTO_WRAP_POLICY = ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"]
FSDP_BACKWARD_PREFETCH = ["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"]
FSDP_STATE_DICT_TYPE = ["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"]
FSDP_MODEL_NAME = "pytorch_model_fsdp"
TORCH_DYNAMO_MODES = ["default", "reduce-overhead", "max-autotune"]
STR_OPERATION_TO_FUNC = {">": _op.gt, ">=": _op.ge, "==": _op.eq, "!=": _op.ne, "<=": _op.le, "<": _op.lt}

__all__ = list(_names) + ["FSDP_SHARDING_STRATEGY", "FSDP_AUTO_WRAP_POLICY", "FSDP_BACKWARD_PREFETCH",
                          "FSDP_STATE_DICT_TYPE", "FSDP_MODEL_NAME", "TORCH_DYNAMO_MODES", "STR_OPERATION_TO_FUNC"]
