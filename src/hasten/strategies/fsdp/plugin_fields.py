"""The vocabulary of the FSDP plugin's fields: Accelerate's lists of names, and names turned into torch's enums.

Accelerate numbers its lists from 1 as torch numbers the enums
(``FSDP_SHARDING_STRATEGY[0]`` is ``ShardingStrategy(1)``), so a field may
be given as a name (any case), a number (``2`` or ``"2"``) or the enum.
Importing this module does not import torch.

Example:
    >>> from torch.distributed.fsdp import ShardingStrategy
    >>> as_enum(ShardingStrategy, "shard_grad_op", "sharding_strategy", FSDP_SHARDING_STRATEGY)
    <ShardingStrategy.SHARD_GRAD_OP: 2>
    >>> setting_name(ShardingStrategy.NO_SHARD), setting_name("hybrid_shard"), setting_name(None)
    ('NO_SHARD', 'HYBRID_SHARD', '')
"""

from __future__ import annotations

from typing import Any

__all__ = ["FSDP_SHARDING_STRATEGY", "FSDP_AUTO_WRAP_POLICY", "FSDP_BACKWARD_PREFETCH", "FSDP_STATE_DICT_TYPE",
           "FSDP2_STATE_DICT_TYPE", "as_enum", "setting_name", "precision_dtypes"]

# Accelerate's lists of the same choices (``accelerate.utils.constants``; transformers validates against them).
FSDP_SHARDING_STRATEGY = ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"]
FSDP_AUTO_WRAP_POLICY = ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"]
FSDP_BACKWARD_PREFETCH = ["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"]
FSDP_STATE_DICT_TYPE = ["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"]
FSDP2_STATE_DICT_TYPE = ["SHARDED_STATE_DICT", "FULL_STATE_DICT"]  # FSDP2's choices, in Accelerate's order


def as_enum(kind: Any, value: Any, field: str, names: list[str]) -> Any:
    """`value` (an enum of `kind`, a name of `names` in any case, or its 1-based number) as the enum.

    Example:
        >>> from torch.distributed.fsdp import StateDictType
        >>> as_enum(StateDictType, 3, "state_dict_type", FSDP_STATE_DICT_TYPE)
        <StateDictType.SHARDED_STATE_DICT: 3>
    """
    if isinstance(value, kind):
        return value
    text = str(value).upper()
    if text in names:
        return kind(names.index(text) + 1)
    if text.isdigit() and int(text) in {member.value for member in kind}:
        return kind(int(text))
    raise ValueError(f"{field}={value!r} is not one of {', '.join(names)}; pass one of those names (or its number, "
                     f"or torch's {kind.__name__}).")


def setting_name(value: Any) -> str:
    """An enum member's name, or a string upper-cased; "" for None.

    Example:
        >>> setting_name("full_state_dict")
        'FULL_STATE_DICT'
    """
    if value is None:
        return ""
    return str(getattr(value, "name", value)).upper()


def precision_dtypes() -> dict[str, Any]:
    """Accelerate's precision names and the dtype FSDP computes in for each (fp8 computes in bf16).

    Example:
        >>> precision_dtypes()["fp8"]
        torch.bfloat16
    """
    import torch

    return {"fp8": torch.bfloat16, "fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
