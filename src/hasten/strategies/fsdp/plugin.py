"""`FullyShardedDataParallelPlugin`: FSDP settings with the peer's fields, values and types, run on FSDP2 (`fully_shard`).

The same settings come from three places, decoded here once: the plugin
object a script passes to `Accelerator(fsdp_plugin=...)` (fields left as
None are read from the ``FSDP_*`` variables, as Accelerate's are), the
`fsdp_config` section of a config file and the `--fsdp_*` launch flags
(both reach each process in the launch spec; see
`hasten.launch.config.FSDPConfig`).

After construction every field holds what Accelerate 1.16's holds (torch's
`ShardingStrategy`, `StateDictType`, `CPUOffload` / `OffloadPolicy`, wrap
policy functions, ...), because libraries read them (TRL hands
`cpu_offload` to `fully_shard`, diffusers reads `sharding_strategy`). The
strategy reads them through the properties at the end of the class
(`shards`, `reshards`, `offload_policy`, `state_dict_name`, `fsdp2_precision`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ...core.environment import str_to_bool
from .plugin_fields import (FSDP_AUTO_WRAP_POLICY, FSDP_BACKWARD_PREFETCH, FSDP_SHARDING_STRATEGY, FSDP_STATE_DICT_TYPE,
                            FSDP2_STATE_DICT_TYPE, as_enum, decode_fsdp1_flags, decode_loading, decode_wrap_policy, flag,
                            precision_dtypes, setting_name)

__all__ = ["FullyShardedDataParallelPlugin", "SHARDING_STRATEGIES", "STATE_DICT_TYPES", "AUTO_WRAP_POLICIES",
           "BACKWARD_PREFETCHES", "FSDP_SHARDING_STRATEGY", "FSDP_AUTO_WRAP_POLICY", "FSDP_BACKWARD_PREFETCH",
           "FSDP_STATE_DICT_TYPE", "FSDP2_STATE_DICT_TYPE", "setting_name"]

SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")  # what hasten saves (FSDP1's LOCAL_STATE_DICT is not)
AUTO_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
BACKWARD_PREFETCHES = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
_RESHARDING = ("FULL_SHARD", "HYBRID_SHARD")  # the strategies that free gathered parameters after forward


@dataclass
class FullyShardedDataParallelPlugin:
    """How FSDP shards a model; hasten runs every setting on FSDP2 (`torch.distributed.fsdp.fully_shard`).

    Fields left as None are read from the ``FSDP_*`` variables (what
    `hasten launch --use_fsdp` and `accelerate launch` export), else take
    Accelerate's defaults: `fsdp_version` 1, FULL_SHARD, no wrap units,
    FULL_STATE_DICT under version 1 and SHARDED_STATE_DICT under 2.

    - `fsdp_version`: 2 (FSDP2's fields: `reshard_after_forward` a bool,
      `cpu_offload` an `OffloadPolicy`), or 1 (FSDP1's: `sharding_strategy` a
      `ShardingStrategy`, `cpu_offload` a `CPUOffload`), which hasten also
      runs on FSDP2, with a one-line notice.
    - `sharding_strategy` (version 1; under 2 hasten still honours one given):
      FULL_SHARD, SHARD_GRAD_OP (parameters kept gathered until backward),
      NO_SHARD (replicated), HYBRID_SHARD / HYBRID_SHARD_ZERO2 (sharded
      within a machine, replicated across machines, on a 2-D mesh).
    - `reshard_after_forward`: free each unit's gathered parameters after
      forward. The root unit keeps them (torch's own default for it).
    - `auto_wrap_policy`: which submodules become their own FSDP unit:
      "transformer_based_wrap" (the classes in `transformer_cls_names_to_wrap`,
      else the model's `_no_split_modules`), "size_based_wrap" (more than
      `min_num_params` parameters), "no_wrap" (the root only), or a callable
      ``module -> bool``.
    - `state_dict_type`: SHARDED_STATE_DICT (every process writes its shard
      with `torch.distributed.checkpoint`) or FULL_STATE_DICT (one full file
      from the main process); `set_state_dict_type` changes it.
    - `mixed_precision_policy`: torch's `MixedPrecisionPolicy` (or FSDP1's
      `MixedPrecision`), a dict of dtypes, or "bf16"/"fp16"/"fp32"; the
      Accelerator sets it from its `mixed_precision` when None.
    - `cpu_ram_efficient_loading` / `sync_module_states`: the main process's
      weights are broadcast to the others at `prepare` (so they may build the
      model on the meta device).
    - `activation_checkpointing` (`_offload`: saved inputs wait in CPU memory).

    Example:
        >>> plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="size_based_wrap")
        >>> plugin.reshard_after_forward, plugin.sharding_strategy, plugin.state_dict_type.name
        (True, None, 'SHARDED_STATE_DICT')
        >>> plugin.auto_wrap_policy.__name__, plugin.min_num_params, type(plugin.cpu_offload).__name__
        ('size_based_auto_wrap_policy', 0, 'OffloadPolicy')
    """

    fsdp_version: int | None = None
    sharding_strategy: Any = None
    reshard_after_forward: Any = None
    backward_prefetch: Any = None
    mixed_precision_policy: Any = None
    auto_wrap_policy: Any = None
    cpu_offload: Any = None
    ignored_modules: Any = None
    state_dict_type: Any = None
    state_dict_config: Any = None
    optim_state_dict_config: Any = None
    limit_all_gathers: bool = True
    use_orig_params: bool | None = None
    param_init_fn: Callable[[Any], Any] | None = None
    sync_module_states: bool | None = None
    forward_prefetch: bool | None = None
    activation_checkpointing: bool | None = None
    activation_checkpointing_offload: bool | None = None
    cpu_ram_efficient_loading: bool | None = None
    transformer_cls_names_to_wrap: list[str] | None = None
    min_num_params: int | None = None

    def __post_init__(self) -> None:
        self._decode(os.environ)

    def _decode(self, env: Mapping[str, str]) -> None:
        """Accelerate's `__post_init__`: each field None is read from `env` (``FSDP_*``), then typed as torch's."""
        from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy

        # One-line notices about settings FSDP2 runs differently; printed once by the strategy that uses the plugin.
        self.notices: list[str] = []
        if self.fsdp_version is None:
            self.fsdp_version = int(env.get("FSDP_VERSION", "1"))
        if self.fsdp_version not in (1, 2):
            raise ValueError(f"fsdp_version={self.fsdp_version!r} is not an FSDP version; use 2 (or 1).")
        v2 = self.fsdp_version == 2
        if v2 and self.sharding_strategy is not None:
            self.notices.append("sharding_strategy is FSDP1's setting; under fsdp_version 2 give reshard_after_forward "
                                "(hasten still honours the strategy given).")
        if not v2:
            if self.sharding_strategy is None:
                self.sharding_strategy = env.get("FSDP_SHARDING_STRATEGY", "FULL_SHARD")
            self.sharding_strategy = as_enum(ShardingStrategy, self.sharding_strategy, "sharding_strategy",
                                             FSDP_SHARDING_STRATEGY)
        self._decode_reshard(env, v2)
        if self.cpu_offload is None:
            self.cpu_offload = flag(env, "FSDP_OFFLOAD_PARAMS")
        self.set_cpu_offload()
        self.validate_cpu_offload()
        if self.backward_prefetch is None:
            self.backward_prefetch = env.get("FSDP_BACKWARD_PREFETCH")
        if setting_name(self.backward_prefetch) == "NO_PREFETCH":
            self.backward_prefetch = None
        if self.backward_prefetch is not None:
            self.backward_prefetch = as_enum(BackwardPrefetch, self.backward_prefetch, "backward_prefetch",
                                             FSDP_BACKWARD_PREFETCH)
            if v2:
                self.notices.append("backward_prefetch is not supported in FSDP2; it is set to None (FSDP2 prefetches "
                                    "the next unit itself).")
                self.backward_prefetch = None
            else:
                self.notices.append("backward_prefetch is an FSDP1 setting; FSDP2 prefetches the next unit itself.")
        self._state_dict_type_from(env)
        decode_wrap_policy(self, env)
        decode_fsdp1_flags(self, env, v2)
        decode_loading(self, env, v2)
        if isinstance(self.mixed_precision_policy, str):
            self.set_mixed_precision(self.mixed_precision_policy, override=True)
        elif isinstance(self.mixed_precision_policy, dict):
            self.set_mixed_precision(self.mixed_precision_policy)
        if self.mixed_precision_policy is not None:
            self.validate_mixed_precision_policy()
        if not v2:
            self.notices.append("fsdp_version 1 is run on FSDP2 (fully_shard) with the same settings; "
                                "set fsdp_version: 2 to silence this notice.")

    def _decode_reshard(self, env: Mapping[str, str], v2: bool) -> None:
        from torch.distributed.fsdp import ShardingStrategy

        if self.reshard_after_forward is None and self.sharding_strategy is None:
            self.reshard_after_forward = env.get("FSDP_RESHARD_AFTER_FORWARD", "true" if v2 else "FULL_SHARD")
        if isinstance(self.reshard_after_forward, str):
            if v2:
                self.reshard_after_forward = bool(str_to_bool(self.reshard_after_forward, to_bool=True))
            else:
                self.reshard_after_forward = as_enum(ShardingStrategy, self.reshard_after_forward,
                                                     "reshard_after_forward", FSDP_SHARDING_STRATEGY)
        if v2 and self.reshard_after_forward is None:  # hasten: FSDP1's strategy given under version 2 decides
            self.reshard_after_forward = setting_name(self.sharding_strategy) in _RESHARDING
        if v2 and not isinstance(self.reshard_after_forward, bool):
            raise ValueError(f"reshard_after_forward={self.reshard_after_forward!r} is not a bool, which FSDP2 needs; "
                             "pass True or False (or use fsdp_version=1 for a ShardingStrategy).")
        if not v2 and isinstance(self.reshard_after_forward, bool):
            raise ValueError(f"reshard_after_forward={self.reshard_after_forward!r} is FSDP2's bool, but fsdp_version "
                             "is 1; pass a ShardingStrategy name such as 'FULL_SHARD', or use fsdp_version=2.")

    # -- Accelerate's setters -------------------------------------------------------------------------
    def set_state_dict_type(self, state_dict_type: Any = None) -> None:
        """Set `state_dict_type` (a name or torch's `StateDictType`) and, where None, its state-dict configs.

        Example:
            >>> plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="FULL_STATE_DICT")
            >>> plugin.set_state_dict_type("SHARDED_STATE_DICT"); plugin.state_dict_type.name
            'SHARDED_STATE_DICT'
        """
        if state_dict_type is not None:
            self.state_dict_type = state_dict_type
        self._state_dict_type_from(os.environ)

    def _state_dict_type_from(self, env: Mapping[str, str]) -> None:
        from torch.distributed.fsdp import (FullOptimStateDictConfig, FullStateDictConfig, ShardedOptimStateDictConfig,
                                            ShardedStateDictConfig, StateDictType)

        if self.state_dict_type is None:
            self.state_dict_type = env.get("FSDP_STATE_DICT_TYPE",
                                           "FULL_STATE_DICT" if self.fsdp_version == 1 else "SHARDED_STATE_DICT")
        self.state_dict_type = as_enum(StateDictType, self.state_dict_type, "state_dict_type", FSDP_STATE_DICT_TYPE)
        if self.state_dict_type == StateDictType.FULL_STATE_DICT:
            if self.state_dict_config is None:
                self.state_dict_config = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
            if self.optim_state_dict_config is None:
                self.optim_state_dict_config = FullOptimStateDictConfig(offload_to_cpu=True, rank0_only=True)
        elif self.state_dict_type == StateDictType.SHARDED_STATE_DICT:
            if self.state_dict_config is None:
                self.state_dict_config = ShardedStateDictConfig(offload_to_cpu=True)
            if self.optim_state_dict_config is None:
                self.optim_state_dict_config = ShardedOptimStateDictConfig(offload_to_cpu=True)
        if self.fsdp_version == 2 and self.state_dict_type == StateDictType.LOCAL_STATE_DICT:
            raise ValueError("FSDP2 has no LOCAL_STATE_DICT; set state_dict_type to SHARDED_STATE_DICT or FULL_STATE_DICT.")

    def set_auto_wrap_policy(self, model: Any) -> None:
        """Bind the wrap policy to `model`, as Accelerate does at `prepare`: a `functools.partial` of torch's policy.

        TRANSFORMER_BASED_WRAP gets the classes named in
        `transformer_cls_names_to_wrap` (else those of the model's
        `_no_split_modules` it contains, as Accelerate 1.16);
        SIZE_BASED_WRAP gets `min_num_params` (0: no wrap units, the policy
        becomes None). A callable of your own is left as it is.

        Example:
            >>> from torch import nn
            >>> plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap",
            ...                                         transformer_cls_names_to_wrap=["Linear"])
            >>> plugin.set_auto_wrap_policy(nn.Sequential(nn.Linear(2, 2)))
            >>> plugin.auto_wrap_policy.keywords["transformer_layer_cls"]
            {<class 'torch.nn.modules.linear.Linear'>}
        """
        import functools

        from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

        from ...runtime.modules import get_module_class_from_name

        if self.auto_wrap_policy is transformer_auto_wrap_policy:
            if self.transformer_cls_names_to_wrap is None:  # a model may name classes it does not instantiate
                self.transformer_cls_names_to_wrap = [name for name in getattr(model, "_no_split_modules", None) or []
                                                      if get_module_class_from_name(model, name) is not None]
            classes = set()
            for name in self.transformer_cls_names_to_wrap:
                found = get_module_class_from_name(model, name)
                if found is None:
                    raise ValueError(f"Could not find the transformer layer class {name} in the model; name a class "
                                     "the model contains in transformer_cls_names_to_wrap.")
                classes.add(found)
            self.auto_wrap_policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=classes)
        elif self.auto_wrap_policy is size_based_auto_wrap_policy:
            self.auto_wrap_policy = (functools.partial(size_based_auto_wrap_policy, min_num_params=self.min_num_params)
                                     if (self.min_num_params or 0) > 0 else None)

    def set_mixed_precision(self, mixed_precision: Any, buffer_autocast: bool = False, override: bool = False) -> None:
        """Set `mixed_precision_policy` from a precision ("bf16", "fp16", "fp8", "fp32" or a dtype) where it is None.

        With `override` it replaces a policy already set; a dict policy of
        dtypes becomes torch's class. Version 2 gets `MixedPrecisionPolicy`
        (parameters and reductions; outputs left as computed, as in
        Accelerate 1.16), version 1 `MixedPrecision` (``buffer_dtype`` too:
        fp32 with `buffer_autocast`).

        Example:
            >>> plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
            >>> plugin.set_mixed_precision("bf16"); plugin.mixed_precision_policy.param_dtype
            torch.bfloat16
        """
        import torch
        from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

        policy_class: Any = MixedPrecision if self.fsdp_version == 1 else MixedPrecisionPolicy
        dtypes = precision_dtypes()
        dtype = mixed_precision
        if isinstance(mixed_precision, str):
            dtype = dtypes.get(mixed_precision)
            if dtype is None:
                raise ValueError(f"mixed_precision={mixed_precision!r} is not one of {list(dtypes)}; pass one of those.")
        elif isinstance(mixed_precision, torch.dtype) and mixed_precision not in dtypes.values():
            raise ValueError(f"mixed_precision={mixed_precision} is not one of {list(dtypes.values())}; pass one of those.")
        extra = {"buffer_dtype": torch.float32 if buffer_autocast else dtype} if self.fsdp_version == 1 else {}
        if override or self.mixed_precision_policy is None:
            self.mixed_precision_policy = policy_class(param_dtype=dtype, reduce_dtype=dtype, **extra)
        elif isinstance(self.mixed_precision_policy, dict):
            keys = ["param_dtype", "reduce_dtype", *extra]
            policy = self.mixed_precision_policy
            if any(key not in policy for key in keys) or any(v not in dtypes.values() for v in policy.values()):
                raise ValueError(f"mixed_precision_policy={policy} must be a dict with the keys {keys} and dtypes among "
                                 f"{list(dtypes.values())}; fix the dict.")
            self.mixed_precision_policy = policy_class(**policy)

    def validate_mixed_precision_policy(self) -> None:
        """Raise unless `mixed_precision_policy` is torch's class for this `fsdp_version`.

        Example:
            >>> FullyShardedDataParallelPlugin(fsdp_version=2, mixed_precision_policy="fp16").validate_mixed_precision_policy()
        """
        from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

        policy_class: type = MixedPrecisionPolicy if self.fsdp_version == 2 else MixedPrecision
        if not isinstance(self.mixed_precision_policy, policy_class):
            raise ValueError(f"mixed_precision_policy must be a torch.distributed.fsdp.{policy_class.__name__} under "
                             f"fsdp_version {self.fsdp_version}, got {type(self.mixed_precision_policy).__name__}; "
                             "pass one, a dict of dtypes or a precision name.")

    def set_cpu_offload(self) -> None:
        """Turn a bool `cpu_offload` into torch's object: `CPUOffloadPolicy`/`OffloadPolicy` (v2), `CPUOffload` (v1).

        Example:
            >>> plugin = FullyShardedDataParallelPlugin(fsdp_version=2, cpu_offload=True)
            >>> type(plugin.cpu_offload).__name__
            'CPUOffloadPolicy'
        """
        if not isinstance(self.cpu_offload, bool):
            return
        if self.fsdp_version == 2:
            from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

            self.cpu_offload = CPUOffloadPolicy() if self.cpu_offload else OffloadPolicy()
        else:
            from torch.distributed.fsdp import CPUOffload

            self.cpu_offload = CPUOffload(offload_params=self.cpu_offload)

    def validate_cpu_offload(self) -> None:
        """Raise unless `cpu_offload` is torch's class for this `fsdp_version`.

        Example:
            >>> FullyShardedDataParallelPlugin(fsdp_version=1, cpu_offload=False).validate_cpu_offload()
        """
        from torch.distributed.fsdp import CPUOffload, OffloadPolicy

        kind: type = OffloadPolicy if self.fsdp_version == 2 else CPUOffload
        if not isinstance(self.cpu_offload, kind):
            raise ValueError(f"cpu_offload must be a bool or a torch.distributed.fsdp.{kind.__name__} under fsdp_version "
                             f"{self.fsdp_version}, got {self.cpu_offload!r}; pass one of those.")

    # -- what the FSDP2 strategy reads -------------------------------------------------------------------
    @property
    def sharding_name(self) -> str:
        """The sharding strategy hasten runs, by name: FSDP1's given, else FULL_SHARD / SHARD_GRAD_OP by resharding.

        Example:
            >>> FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=False).sharding_name
            'SHARD_GRAD_OP'
        """
        if self.sharding_strategy is not None:
            return setting_name(self.sharding_strategy)
        return "FULL_SHARD" if self.reshards else "SHARD_GRAD_OP"

    @property
    def is_hybrid(self) -> bool:
        """True for HYBRID_SHARD / HYBRID_SHARD_ZERO2: sharded within a machine, replicated across machines.

        Example:
            >>> FullyShardedDataParallelPlugin(fsdp_version=1, sharding_strategy="HYBRID_SHARD").is_hybrid
            True
        """
        return self.sharding_name.startswith("HYBRID")

    @property
    def shards(self) -> bool:
        """False for NO_SHARD (replicated on every process).

        Example:
            >>> FullyShardedDataParallelPlugin(fsdp_version=1, sharding_strategy="NO_SHARD").shards
            False
        """
        return self.sharding_name != "NO_SHARD"

    @property
    def reshards(self) -> bool:
        """Whether units free their gathered parameters after forward (FSDP2's `reshard_after_forward`).

        Example:
            >>> FullyShardedDataParallelPlugin(fsdp_version=1, sharding_strategy="SHARD_GRAD_OP").reshards
            False
        """
        if isinstance(self.reshard_after_forward, bool):
            return self.reshard_after_forward
        strategy = self.reshard_after_forward if self.reshard_after_forward is not None else self.sharding_strategy
        return setting_name(strategy) in _RESHARDING

    @property
    def offload_policy(self) -> Any:
        """The FSDP2 `OffloadPolicy` for `fully_shard`: `cpu_offload` itself under version 2, converted under 1.

        Example:
            >>> type(FullyShardedDataParallelPlugin(fsdp_version=1, cpu_offload=True).offload_policy).__name__
            'CPUOffloadPolicy'
        """
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

        if isinstance(self.cpu_offload, OffloadPolicy):
            return self.cpu_offload
        return CPUOffloadPolicy() if getattr(self.cpu_offload, "offload_params", False) else OffloadPolicy()

    @property
    def state_dict_name(self) -> str:
        """`state_dict_type` by name ("FULL_STATE_DICT", "SHARDED_STATE_DICT"), whatever form it was set in.

        Example:
            >>> FullyShardedDataParallelPlugin(fsdp_version=1).state_dict_name
            'FULL_STATE_DICT'
        """
        return setting_name(self.state_dict_type)

    def fsdp2_precision(self) -> Any:
        """`mixed_precision_policy` as FSDP2's `MixedPrecisionPolicy` (FSDP1's `MixedPrecision` converted); None if unset.

        Example:
            >>> FullyShardedDataParallelPlugin(fsdp_version=1, mixed_precision_policy="bf16").fsdp2_precision().param_dtype
            torch.bfloat16
        """
        from torch.distributed.fsdp import MixedPrecisionPolicy

        policy = self.mixed_precision_policy
        if policy is None or isinstance(policy, MixedPrecisionPolicy):
            return policy
        return MixedPrecisionPolicy(param_dtype=policy.param_dtype, reduce_dtype=policy.reduce_dtype)

    @classmethod
    def from_launch_config(cls, section: dict[str, Any]) -> "FullyShardedDataParallelPlugin":
        """Build from an `fsdp_config` section (config file or `--fsdp_*` flags, as `hasten.launch.config.FSDPConfig` holds it).

        Keys the section lacks take hasten's launch defaults (version 2,
        transformer-based wrapping, sharded checkpoints); FSDP1's settings are
        read only under version 1, as Accelerate reads their variables.

        Example:
            >>> FullyShardedDataParallelPlugin.from_launch_config({"fsdp_version": 2, "fsdp_state_dict_type": "FULL_STATE_DICT"}).state_dict_type.name
            'FULL_STATE_DICT'
        """
        get = section.get
        version = int(get("fsdp_version", 2))
        strategy = get("fsdp_sharding_strategy")
        kwargs: dict[str, Any] = dict(
            fsdp_version=version,
            auto_wrap_policy=get("fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP"),
            transformer_cls_names_to_wrap=get("fsdp_transformer_layer_cls_to_wrap"),
            min_num_params=int(get("fsdp_min_num_params", 100_000_000)),
            state_dict_type=get("fsdp_state_dict_type", "SHARDED_STATE_DICT"),
            cpu_offload=bool(get("fsdp_offload_params", False)),
            activation_checkpointing=bool(get("fsdp_activation_checkpointing", False)),
            activation_checkpointing_offload=bool(get("fsdp_activation_checkpointing_offload", False)),
            cpu_ram_efficient_loading=bool(get("fsdp_cpu_ram_efficient_loading", True)),
            backward_prefetch=get("fsdp_backward_prefetch"),
            ignored_modules=get("fsdp_ignored_modules"),
        )
        if version == 2:
            # The file's reshard flag (FSDP2's name) defaults to true; a ZeRO-2-like strategy (FSDP1's name) turns it off.
            kwargs["reshard_after_forward"] = bool(get("fsdp_reshard_after_forward", True)) and (
                str(strategy).upper() not in ("SHARD_GRAD_OP", "HYBRID_SHARD_ZERO2"))
            if strategy is not None and str(strategy).upper().startswith(("HYBRID", "NO_SHARD")):
                kwargs["sharding_strategy"] = strategy  # the mesh it needs (hasten honours it under version 2)
        else:
            kwargs.update(sharding_strategy=strategy or "FULL_SHARD", forward_prefetch=bool(get("fsdp_forward_prefetch", False)),
                          use_orig_params=bool(get("fsdp_use_orig_params", True)),
                          sync_module_states=bool(get("fsdp_sync_module_states", True)))
        if kwargs["auto_wrap_policy"] is not None and str(kwargs["auto_wrap_policy"]).upper() != "SIZE_BASED_WRAP":
            kwargs["min_num_params"] = None
        return cls(**kwargs)
