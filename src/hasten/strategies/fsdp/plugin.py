"""`FullyShardedDataParallelPlugin`: FSDP settings with the peer's field names, run on FSDP2 (`fully_shard`).

The same settings come from three places, decoded here once: the plugin
object a script passes to `Accelerator(fsdp_plugin=...)`, the `fsdp_config`
section of a config file, and the `--fsdp_*` launch flags (both reach each
process in the launch spec; see `hasten.launch.config.FSDPConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["FullyShardedDataParallelPlugin", "SHARDING_STRATEGIES", "STATE_DICT_TYPES", "AUTO_WRAP_POLICIES",
           "BACKWARD_PREFETCHES", "FSDP_SHARDING_STRATEGY", "FSDP_AUTO_WRAP_POLICY", "FSDP_BACKWARD_PREFETCH",
           "FSDP_STATE_DICT_TYPE", "FSDP2_STATE_DICT_TYPE"]

SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")
AUTO_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
BACKWARD_PREFETCHES = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
# Accelerate's lists of the same choices (``accelerate.utils.constants``; transformers validates against them).
# Its state-dict list also names FSDP1's LOCAL_STATE_DICT, which FSDP2 has no use for.
FSDP_SHARDING_STRATEGY = list(SHARDING_STRATEGIES)
FSDP_AUTO_WRAP_POLICY = list(AUTO_WRAP_POLICIES)
FSDP_BACKWARD_PREFETCH = list(BACKWARD_PREFETCHES)
FSDP_STATE_DICT_TYPE = ["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"]
FSDP2_STATE_DICT_TYPE = ["SHARDED_STATE_DICT", "FULL_STATE_DICT"]  # FSDP2's choices, in Accelerate's order


def _upper(value: Any) -> Any:
    return value.upper() if isinstance(value, str) else value


@dataclass
class FullyShardedDataParallelPlugin:
    """How FSDP shards a model; hasten runs every setting on FSDP2 (`torch.distributed.fsdp.fully_shard`).

    - `sharding_strategy`: FULL_SHARD (parameters, gradients and optimizer
      state sharded; parameters freed after forward), SHARD_GRAD_OP (kept
      gathered between forward and backward), NO_SHARD (replicated),
      HYBRID_SHARD / HYBRID_SHARD_ZERO2 (sharded within a machine,
      replicated across machines, on a 2-D mesh).
    - `reshard_after_forward`: free each unit's gathered parameters after
      forward (default: True for FULL_SHARD / HYBRID_SHARD). The root unit
      keeps them (torch's own default for it): backward needs the root first,
      so freeing them would only add one all-gather per step.
    - `auto_wrap_policy`: which submodules become their own FSDP unit:
      TRANSFORMER_BASED_WRAP (classes named in `transformer_cls_names_to_wrap`,
      else the model's `_no_split_modules`), SIZE_BASED_WRAP (subtrees of at
      least `min_num_params` parameters), NO_WRAP (the root only), or a
      callable ``module -> bool``.
    - `state_dict_type`: SHARDED_STATE_DICT (checkpoints written by every
      process with `torch.distributed.checkpoint`) or FULL_STATE_DICT (one
      full file written by the main process).
    - `fsdp_version`: 2; 1 is accepted and run on FSDP2, with a one-line notice.
    - `activation_checkpointing_offload`: with `activation_checkpointing`, keep
      each checkpointed unit's saved input in CPU memory until backward
      (on a CPU run there is nothing to move).
    - `state_dict_config` / `optim_state_dict_config`: torch's FSDP state-dict
      configs (default, as Accelerate's: offloaded to CPU, and on rank 0 only
      for FULL_STATE_DICT); `save_fsdp_model` honours `offload_to_cpu`.
    - `param_init_fn`: how a module whose tensors are on the meta device gets
      real storage on processes that receive the main process's weights
      (default: `to_empty` on the run's device).

    Example:
        >>> plugin = FullyShardedDataParallelPlugin(sharding_strategy="SHARD_GRAD_OP", fsdp_version=2)
        >>> plugin.reshard_after_forward
        False
    """

    fsdp_version: int = 2
    sharding_strategy: str = "FULL_SHARD"
    reshard_after_forward: bool | None = None  # None: from sharding_strategy
    auto_wrap_policy: str | Callable[[Any], bool] | None = "TRANSFORMER_BASED_WRAP"
    transformer_cls_names_to_wrap: list[str] | None = None
    min_num_params: int = 100_000_000
    state_dict_type: str = "SHARDED_STATE_DICT"
    cpu_offload: bool = False
    activation_checkpointing: bool = False
    cpu_ram_efficient_loading: bool = True
    sync_module_states: bool = True
    mixed_precision_policy: Any = None  # a torch MixedPrecisionPolicy; None: from the Accelerator's mixed_precision
    ignored_modules: list[Any] | None = None
    activation_checkpointing_offload: bool = False
    state_dict_config: Any = None  # torch's Full/ShardedStateDictConfig; None: from state_dict_type
    optim_state_dict_config: Any = None  # torch's Full/ShardedOptimStateDictConfig; None: from state_dict_type
    param_init_fn: Callable[[Any], Any] | None = None  # module -> module, for modules on the meta device
    # FSDP1 knobs that FSDP2 has no use for; accepted so peer scripts and files run, and ignored with a notice.
    backward_prefetch: str | None = None
    forward_prefetch: bool = False
    use_orig_params: bool = True
    limit_all_gathers: bool = True
    # One-line notices about settings FSDP2 runs differently; printed once by the strategy that uses the plugin.
    notices: list[str] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.sharding_strategy = _upper(getattr(self.sharding_strategy, "name", self.sharding_strategy))
        self.state_dict_type = _upper(getattr(self.state_dict_type, "name", self.state_dict_type))
        if isinstance(self.auto_wrap_policy, str):
            self.auto_wrap_policy = self.auto_wrap_policy.upper()
        if self.sharding_strategy not in SHARDING_STRATEGIES:
            raise ValueError(f"sharding_strategy={self.sharding_strategy!r} is not one of {', '.join(SHARDING_STRATEGIES)}.")
        if self.state_dict_type not in STATE_DICT_TYPES:
            raise ValueError(f"state_dict_type={self.state_dict_type!r} is not one of {', '.join(STATE_DICT_TYPES)}.")
        if isinstance(self.auto_wrap_policy, str) and self.auto_wrap_policy not in AUTO_WRAP_POLICIES:
            raise ValueError(f"auto_wrap_policy={self.auto_wrap_policy!r} is not one of {', '.join(AUTO_WRAP_POLICIES)} "
                             "(or a callable module -> bool).")
        if self.fsdp_version not in (1, 2):
            raise ValueError(f"fsdp_version={self.fsdp_version!r} must be 1 or 2.")
        if self.activation_checkpointing_offload and not self.activation_checkpointing:
            raise ValueError("activation_checkpointing_offload=True needs activation_checkpointing=True; "
                             "set both, or drop activation_checkpointing_offload.")
        self._default_state_dict_configs()
        if self.fsdp_version == 1:
            self.notices.append("fsdp_version 1 is run on FSDP2 (fully_shard) with the same settings; "
                                "set fsdp_version: 2 to silence this notice.")
        if isinstance(self.transformer_cls_names_to_wrap, str):
            self.transformer_cls_names_to_wrap = [n.strip() for n in self.transformer_cls_names_to_wrap.split(",") if n.strip()]
        if self.reshard_after_forward is None:
            self.reshard_after_forward = self.sharding_strategy in ("FULL_SHARD", "HYBRID_SHARD")
        elif not isinstance(self.reshard_after_forward, bool):  # the peer lets it name a strategy too
            self.reshard_after_forward = _upper(getattr(self.reshard_after_forward, "name", self.reshard_after_forward)) in (
                "FULL_SHARD", "HYBRID_SHARD", "TRUE")
        if self.forward_prefetch:
            self.notices.append("forward_prefetch is an FSDP1 setting; FSDP2 overlaps the next unit's all-gather itself, "
                                "so it is not used.")
        if not self.use_orig_params:
            self.notices.append("use_orig_params=False is an FSDP1 setting; FSDP2 always keeps the original parameters.")
        if self.backward_prefetch not in (None, "NO_PREFETCH", "BACKWARD_PRE"):
            self.notices.append(f"backward_prefetch={self.backward_prefetch} is an FSDP1 setting; FSDP2 prefetches "
                                "the next unit itself, so it is not used.")

    def _default_state_dict_configs(self) -> None:
        """Accelerate's defaults for the state-dict configs left as None (torch's classes, imported only then)."""
        if self.state_dict_config is not None and self.optim_state_dict_config is not None:
            return
        from torch.distributed.fsdp import (FullOptimStateDictConfig, FullStateDictConfig, ShardedOptimStateDictConfig,
                                            ShardedStateDictConfig)

        model: Any
        optim: Any
        if self.state_dict_type == "FULL_STATE_DICT":
            model, optim = FullStateDictConfig(offload_to_cpu=True, rank0_only=True), FullOptimStateDictConfig(
                offload_to_cpu=True, rank0_only=True)
        else:
            model, optim = ShardedStateDictConfig(offload_to_cpu=True), ShardedOptimStateDictConfig(offload_to_cpu=True)
        self.state_dict_config = model if self.state_dict_config is None else self.state_dict_config
        self.optim_state_dict_config = optim if self.optim_state_dict_config is None else self.optim_state_dict_config

    @property
    def is_hybrid(self) -> bool:
        return self.sharding_strategy.startswith("HYBRID")

    @property
    def shards(self) -> bool:
        return self.sharding_strategy != "NO_SHARD"

    @classmethod
    def from_launch_config(cls, section: dict[str, Any]) -> "FullyShardedDataParallelPlugin":
        """Build from an `fsdp_config` section (config file or `--fsdp_*` flags, as `hasten.launch.config.FSDPConfig` holds it).

        Example:
            >>> FullyShardedDataParallelPlugin.from_launch_config({"fsdp_version": 2, "fsdp_state_dict_type": "FULL_STATE_DICT"}).state_dict_type
            'FULL_STATE_DICT'
        """
        get = section.get
        names = get("fsdp_transformer_layer_cls_to_wrap")
        strategy = _upper(get("fsdp_sharding_strategy", "FULL_SHARD"))
        # The file's reshard flag (FSDP2's name) defaults to true; a ZeRO-2-like strategy (FSDP1's name) turns it off.
        reshard = bool(get("fsdp_reshard_after_forward", True)) and strategy not in ("SHARD_GRAD_OP", "HYBRID_SHARD_ZERO2")
        return cls(
            fsdp_version=int(get("fsdp_version", 2)),
            sharding_strategy=strategy,
            reshard_after_forward=reshard,
            auto_wrap_policy=get("fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP"),
            transformer_cls_names_to_wrap=names,
            min_num_params=int(get("fsdp_min_num_params", 100_000_000)),
            state_dict_type=get("fsdp_state_dict_type", "SHARDED_STATE_DICT"),
            cpu_offload=bool(get("fsdp_offload_params", False)),
            activation_checkpointing=bool(get("fsdp_activation_checkpointing", False)),
            activation_checkpointing_offload=bool(get("fsdp_activation_checkpointing_offload", False)),
            cpu_ram_efficient_loading=bool(get("fsdp_cpu_ram_efficient_loading", True)),
            sync_module_states=bool(get("fsdp_sync_module_states", True)),
            backward_prefetch=get("fsdp_backward_prefetch"),
            forward_prefetch=bool(get("fsdp_forward_prefetch", False)),
            use_orig_params=bool(get("fsdp_use_orig_params", True)),
        )
