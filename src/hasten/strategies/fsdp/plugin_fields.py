"""The vocabulary of the FSDP plugin's fields (Accelerate's lists of names, names turned into torch's enums) and their decoding.

Accelerate numbers its lists from 1 as torch numbers the enums
(``FSDP_SHARDING_STRATEGY[0]`` is ``ShardingStrategy(1)``), so a field may
be given as a name (any case), a number (``2`` or ``"2"``) or the enum.
The `decode_*` functions are the plugin's `__post_init__` in parts: each
reads a field left None from the ``FSDP_*`` variables, as Accelerate's
does. Importing this module does not import torch.

Example:
    >>> from torch.distributed.fsdp import ShardingStrategy
    >>> as_enum(ShardingStrategy, "shard_grad_op", "sharding_strategy", FSDP_SHARDING_STRATEGY)
    <ShardingStrategy.SHARD_GRAD_OP: 2>
    >>> setting_name(ShardingStrategy.NO_SHARD), setting_name("hybrid_shard"), setting_name(None)
    ('NO_SHARD', 'HYBRID_SHARD', '')
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from ...core.environment import str_to_bool

__all__ = ["FSDP_SHARDING_STRATEGY", "FSDP_AUTO_WRAP_POLICY", "FSDP_BACKWARD_PREFETCH", "FSDP_STATE_DICT_TYPE",
           "FSDP2_STATE_DICT_TYPE", "as_enum", "setting_name", "precision_dtypes", "flag", "decode_wrap_policy",
           "decode_fsdp1_flags", "decode_loading"]

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


def flag(env: Mapping[str, str], name: str, default: str = "False") -> bool:
    """A true/false variable of `env`, read as Accelerate reads it (yes/no, true/false, on/off, 1/0).

    Example:
        >>> flag({"FSDP_OFFLOAD_PARAMS": "true"}, "FSDP_OFFLOAD_PARAMS"), flag({}, "FSDP_OFFLOAD_PARAMS")
        (True, False)
    """
    return bool(str_to_bool(env.get(name, default), to_bool=True))


# -- the parts of the plugin's __post_init__ (Accelerate's order): each reads a field left None from ``FSDP_*`` --
def decode_wrap_policy(plugin: Any, env: Mapping[str, str]) -> None:
    """`auto_wrap_policy` (else ``FSDP_AUTO_WRAP_POLICY``) as torch's policy function, with its names or size.

    Example:
        >>> from types import SimpleNamespace
        >>> plugin = SimpleNamespace(auto_wrap_policy=None, transformer_cls_names_to_wrap=None, min_num_params=None)
        >>> decode_wrap_policy(plugin, {"FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP", "FSDP_TRANSFORMER_CLS_TO_WRAP": "A,B"})
        >>> plugin.auto_wrap_policy.__name__, plugin.transformer_cls_names_to_wrap
        ('transformer_auto_wrap_policy', ['A', 'B'])
    """
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

    if plugin.auto_wrap_policy is None:
        plugin.auto_wrap_policy = env.get("FSDP_AUTO_WRAP_POLICY", "NO_WRAP")
    if not isinstance(plugin.auto_wrap_policy, str):
        return
    name = plugin.auto_wrap_policy.upper()
    if name not in FSDP_AUTO_WRAP_POLICY:
        raise ValueError(f"auto_wrap_policy={plugin.auto_wrap_policy!r} is not one of {', '.join(FSDP_AUTO_WRAP_POLICY)}; "
                         "pick one of those or pass a callable module -> bool.")
    if name == "TRANSFORMER_BASED_WRAP":
        plugin.auto_wrap_policy = transformer_auto_wrap_policy
        if plugin.transformer_cls_names_to_wrap is None:
            plugin.transformer_cls_names_to_wrap = env.get("FSDP_TRANSFORMER_CLS_TO_WRAP")
        if isinstance(plugin.transformer_cls_names_to_wrap, str):
            plugin.transformer_cls_names_to_wrap = [n.strip() for n in plugin.transformer_cls_names_to_wrap.split(",")]
    elif name == "SIZE_BASED_WRAP":
        plugin.auto_wrap_policy = size_based_auto_wrap_policy
        if plugin.min_num_params is None:
            plugin.min_num_params = int(env.get("FSDP_MIN_NUM_PARAMS", 0))
        elif not isinstance(plugin.min_num_params, int):
            raise ValueError(f"min_num_params={plugin.min_num_params!r} is not an integer; pass a whole number of "
                             "parameters.")
    else:
        plugin.auto_wrap_policy = None


def decode_fsdp1_flags(plugin: Any, env: Mapping[str, str], v2: bool) -> None:
    """use_orig_params, sync_module_states, forward_prefetch: FSDP1's (read from the environment only there).

    Example:
        >>> from types import SimpleNamespace
        >>> plugin = SimpleNamespace(use_orig_params=None, sync_module_states=None, forward_prefetch=None, notices=[])
        >>> decode_fsdp1_flags(plugin, {"FSDP_USE_ORIG_PARAMS": "true"}, v2=False)
        >>> plugin.use_orig_params, plugin.sync_module_states, plugin.forward_prefetch
        (True, False, False)
    """
    for name, variable in (("use_orig_params", "FSDP_USE_ORIG_PARAMS"), ("sync_module_states", "FSDP_SYNC_MODULE_STATES")):
        if getattr(plugin, name) is None and not v2:
            setattr(plugin, name, flag(env, variable))
        if v2 and getattr(plugin, name) is not None:
            plugin.notices.append(f"{name} is obsolete in FSDP2 and set to None.")
            setattr(plugin, name, None)
    if plugin.forward_prefetch is None and not v2:
        plugin.forward_prefetch = flag(env, "FSDP_FORWARD_PREFETCH")
    if v2 and plugin.forward_prefetch is not None:
        raise ValueError("forward_prefetch is an FSDP1 setting that FSDP2 does not have; leave it None or use "
                         "fsdp_version=1.")
    if plugin.forward_prefetch:
        plugin.notices.append("forward_prefetch is an FSDP1 setting; FSDP2 overlaps the next unit's all-gather "
                              "itself, so it is not used.")
    if plugin.use_orig_params is False:
        plugin.notices.append("use_orig_params=False is an FSDP1 setting; FSDP2 always keeps the original parameters.")


def decode_loading(plugin: Any, env: Mapping[str, str], v2: bool) -> None:
    """Activation checkpointing, ignored modules, RAM-efficient loading (which needs sync_module_states under FSDP1).

    Example:
        >>> from types import SimpleNamespace
        >>> plugin = SimpleNamespace(activation_checkpointing=None, activation_checkpointing_offload=None,
        ...                          ignored_modules=None, cpu_ram_efficient_loading=None, sync_module_states=None)
        >>> decode_loading(plugin, {"FSDP_ACTIVATION_CHECKPOINTING": "1", "FSDP_IGNORED_MODULES": "head.*"}, v2=True)
        >>> plugin.activation_checkpointing, plugin.ignored_modules, plugin.cpu_ram_efficient_loading
        (True, 'head.*', False)
    """
    if plugin.activation_checkpointing is None:
        plugin.activation_checkpointing = flag(env, "FSDP_ACTIVATION_CHECKPOINTING")
    if plugin.activation_checkpointing_offload is None:
        plugin.activation_checkpointing_offload = flag(env, "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD")
    if plugin.activation_checkpointing_offload and not plugin.activation_checkpointing:
        raise ValueError("activation_checkpointing_offload=True needs activation_checkpointing=True; "
                         "set both, or drop activation_checkpointing_offload.")
    if plugin.activation_checkpointing_offload and not v2:
        raise ValueError("activation_checkpointing_offload=True needs fsdp_version=2; set it, or drop the offload.")
    if plugin.ignored_modules is None:
        plugin.ignored_modules = env.get("FSDP_IGNORED_MODULES")
    if plugin.cpu_ram_efficient_loading is None:
        plugin.cpu_ram_efficient_loading = flag(env, "FSDP_CPU_RAM_EFFICIENT_LOADING")
    else:  # transformers reads it when it loads pretrained weights, as under Accelerate
        os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = str(plugin.cpu_ram_efficient_loading)
    if not v2 and plugin.cpu_ram_efficient_loading and not plugin.sync_module_states:
        plugin.notices.append("cpu_ram_efficient_loading needs sync_module_states; it is set to True.")
        plugin.sync_module_states = True
    if plugin.sync_module_states:  # Accelerate's: modules on meta get empty storage on this process's device
        import torch

        device = torch.device(torch.accelerator.current_accelerator() or "cpu")
        if device.type != "cpu":
            device = torch.device(device.type, torch.accelerator.current_device_index())
        plugin.param_init_fn = lambda module: module.to_empty(device=device, recurse=False)
