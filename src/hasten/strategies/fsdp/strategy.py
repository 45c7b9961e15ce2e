"""FSDP2: parameters, gradients and optimizer state sharded with `fully_shard` on a `DeviceMesh`.

Works the same on CPUs over gloo and on GPUs over NCCL. Set-up order per
model: tensor parallel (when the mesh has a "tp" dimension), activation
checkpointing, one `fully_shard` per wrapped unit, then the root; then the
main process's weights are broadcast to every process (so other processes
may build the model on the meta device). Optimizers built before `prepare`
follow the parameters `fully_shard` replaced.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence, cast

import torch
import torch.distributed as dist
from torch import nn

from .plugin import FullyShardedDataParallelPlugin
from ...options import DistributedType
from ...runtime.modules import get_parameters_from_modules
from ...runtime.precision import PrecisionPolicy, make_precision_policy
from . import checkpoint as fsdp_checkpoint
from ..base import ShardedState, Strategy, notice_once

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule

    from ..parallel.mesh import ParallelismConfig

__all__ = ["FSDPStrategy"]


class _GradientSyncOff:
    """`with`: reduce-scatter nothing in backward (gradients accumulate unsharded, full size, until the sync step)."""

    __slots__ = ("model",)

    def __init__(self, model: FSDPModule) -> None:
        self.model = model

    def __enter__(self) -> None:
        self.model.set_requires_gradient_sync(False)

    def __exit__(self, *exc: Any) -> None:
        self.model.set_requires_gradient_sync(True)


def wrap_unit_filter(plugin: FullyShardedDataParallelPlugin, model: nn.Module) -> Callable[[nn.Module], bool]:
    """Which submodules become their own FSDP unit (and get activation checkpointing), from the plugin's policy.

    torch's `transformer_auto_wrap_policy` (or a partial of it): the classes named
    in `transformer_cls_names_to_wrap`, else the model's `_no_split_modules`;
    `size_based_auto_wrap_policy`: modules of more than `min_num_params`
    parameters (none when it is 0); None: no units; another callable: used as
    ``module -> bool``, or asked FSDP1's question for each module when it takes FSDP1's
    ``(module, recurse, nonwrapped_numel)`` (PEFT's `fsdp_auto_wrap_policy`).

    Example:
        >>> plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap",
        ...                                         transformer_cls_names_to_wrap=["Linear"])
        >>> wrap_unit_filter(plugin, nn.Sequential(nn.Linear(2, 2)))(nn.Linear(2, 2))
        True
    """
    import functools

    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

    policy = plugin.auto_wrap_policy
    function = policy.func if isinstance(policy, functools.partial) else policy
    name = policy.upper() if isinstance(policy, str) else ""  # a name assigned after construction
    if policy is None or name == "NO_WRAP":
        return lambda module: False
    if function is size_based_auto_wrap_policy or name == "SIZE_BASED_WRAP":
        threshold = plugin.min_num_params or 0
        if threshold <= 0:  # Accelerate's: a policy of 0 parameters wraps nothing
            return lambda module: False
        return lambda module: sum(p.numel() for p in module.parameters()) > threshold
    if function is not transformer_auto_wrap_policy and name != "TRANSFORMER_BASED_WRAP":
        return _as_module_test(policy)
    present = {type(m).__name__ for m in model.modules()}
    # the model's `_no_split_modules` may name classes it does not instantiate: those are left out (Accelerate 1.16)
    names = list(plugin.transformer_cls_names_to_wrap
                 or [n for n in getattr(model, "_no_split_modules", None) or [] if n in present])
    missing = [n for n in names if n not in present]
    if missing:
        raise ValueError(
            f"transformer_cls_names_to_wrap names {missing}, which this model does not contain; "
            f"use class names from the model (e.g. {sorted(present - {type(model).__name__})[:5]})."
        )
    wanted = set(names)
    return lambda module: type(getattr(module, "_checkpoint_wrapped_module", module)).__name__ in wanted


def _as_module_test(policy: Callable[..., Any]) -> Callable[[nn.Module], bool]:
    """A callable policy as ``module -> bool``: one of FSDP1's protocol (``module, recurse, nonwrapped_numel``, as
    PEFT's `fsdp_auto_wrap_policy` builds) is asked FSDP1's question for each module: wrap it as a unit?"""
    import inspect

    try:
        parameters = inspect.signature(policy).parameters
    except (TypeError, ValueError):
        return cast(Callable[[nn.Module], bool], policy)
    if not {"recurse", "nonwrapped_numel"} <= set(parameters):
        return cast(Callable[[nn.Module], bool], policy)
    return lambda module: bool(policy(module=module, recurse=False,
                                      nonwrapped_numel=sum(p.numel() for p in module.parameters())))


def offload_saved_inputs(unit: nn.Module, pin_memory: bool = True) -> None:
    """Keep the input `unit`'s activation checkpoint saves for its recompute in CPU memory until backward."""
    from torch.autograd.graph import save_on_cpu

    from torch.distributed._composable import checkpoint

    def enter(module: nn.Module, args: Any) -> None:
        # Off during backward's recompute (the checkpoint turns its own hooks off then): nothing to keep there.
        context = save_on_cpu(pin_memory=pin_memory) if checkpoint.state(module).enable_hook else None
        if context is not None:
            context.__enter__()
        module.__dict__.setdefault("_hasten_offload", []).append(context)

    def leave(module: nn.Module, args: Any, output: Any) -> None:
        context = module.__dict__["_hasten_offload"].pop()
        if context is not None:
            context.__exit__(None, None, None)

    # Around the checkpoint's own hooks: the inputs it keeps for the recompute are saved outside its region.
    unit.register_forward_pre_hook(enter, prepend=True)
    unit.register_forward_hook(leave, always_call=True)


def _materialize(model: nn.Module, device: torch.device, param_init_fn: Callable[[nn.Module], Any] | None) -> None:
    """Give a model built on the meta device real (uninitialised) storage; the main process's weights follow.

    With the plugin's `param_init_fn`, each module holding meta tensors of its
    own is passed to it (as FSDP1's); whatever is still on meta goes to `device`.
    """
    if param_init_fn is not None:
        for module in list(model.modules()):
            own = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
            if any(t.is_meta for t in own):
                param_init_fn(module)
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        model.to_empty(device=device)


class FSDPStrategy(Strategy):
    """Shard every prepared model with FSDP2; the optimizer steps on each process's shard.

    Example:
        >>> strategy = FSDPStrategy(torch.device("cpu"), None, FullyShardedDataParallelPlugin(fsdp_version=2), world_size=1)
        >>> strategy.distributed_type.value, strategy.writes_own_checkpoint_files
        ('FSDP', True)
    """

    name = "fsdp"
    state_needs_every_process = True
    replaces_parameters = True

    def __init__(self, device: torch.device, precision: PrecisionPolicy | None, plugin: FullyShardedDataParallelPlugin,
                 world_size: int, parallelism_config: ParallelismConfig | None = None) -> None:
        super().__init__(device, precision)
        self.plugin = plugin
        self.world_size = world_size
        self.parallelism_config = parallelism_config
        self.writes_own_checkpoint_files = plugin.state_dict_name == "SHARDED_STATE_DICT"  # type: ignore[misc]
        self._mesh: DeviceMesh | None = None
        self._models: list[nn.Module] = []

    @classmethod
    def create(cls, device: torch.device, world_size: int, mixed_precision: str, plugin: FullyShardedDataParallelPlugin | None,
               *, parallelism_config: ParallelismConfig | None = None, scaler_kwargs: dict[str, Any] | None = None,
               sync_each_batch: bool = False) -> "FSDPStrategy":
        """The strategy with its precision: fp16 loss scaling agrees on inf/NaN across shards (`ShardedGradScaler`)."""
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        plugin = plugin if plugin is not None else FullyShardedDataParallelPlugin()
        if plugin.state_dict_name not in ("FULL_STATE_DICT", "SHARDED_STATE_DICT"):
            raise ValueError(f"state_dict_type {plugin.state_dict_name} is FSDP1's per-process format, which hasten's "
                             "FSDP2 does not write; use SHARDED_STATE_DICT (or FULL_STATE_DICT).")
        for message in plugin.notices:
            notice_once(message)
        precision = make_precision_policy(mixed_precision, device, scaler_kwargs, scaler_class=ShardedGradScaler)
        if precision.dtype is not None:  # as Accelerate's state: a policy left None follows the Accelerator's precision
            plugin.set_mixed_precision(precision.dtype)
        strategy = cls(device, precision, plugin, world_size, parallelism_config)
        strategy.sync_each_batch = sync_each_batch
        return strategy

    @property
    def shards(self) -> bool:
        """False for tensor parallel alone (a ParallelismConfig without data-parallel dims): nothing to `fully_shard`."""
        config = self.parallelism_config
        return config is None or config.dp_enabled or config.cp_enabled

    @property
    def distributed_type(self) -> DistributedType:
        if not self.shards:  # Accelerate's type for tensor parallel alone: the plain multi-device one
            return DistributedType.MULTI_GPU if self.device.type == "cuda" else DistributedType.MULTI_CPU
        return DistributedType.FSDP

    @property
    def peer_engine_saves_models(self) -> bool:
        return self.shards  # Accelerate's FSDP saves models itself; tensor parallel alone is a plain multi-device run

    def peer_model(self, original: nn.Module, prepared: nn.Module) -> nn.Module:
        return prepared  # Accelerate's `_models` holds the FSDP-wrapped model

    # -- the mesh ------------------------------------------------------------------------------
    @property
    def mesh(self) -> DeviceMesh:
        """The `DeviceMesh`: from the ParallelismConfig, else 1-D (or 2-D for hybrid / no sharding) over all processes."""
        if self._mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            if self.parallelism_config is not None:
                self._mesh = self.parallelism_config.build_device_mesh(self.device.type)
            elif self.plugin.is_hybrid or not self.plugin.shards:
                per_machine = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))
                shard = per_machine if self.plugin.shards else 1
                self._mesh = init_device_mesh(self.device.type, (self.world_size // shard, shard),
                                              mesh_dim_names=("dp_replicate", "dp_shard"))
            else:
                self._mesh = init_device_mesh(self.device.type, (self.world_size,), mesh_dim_names=("dp_shard",))
        return self._mesh

    @property
    def device_mesh(self) -> DeviceMesh:
        return self.mesh

    def _data_parallel_mesh(self) -> DeviceMesh:
        config = self.parallelism_config
        if config is not None and config.cp_enabled:  # as Accelerate: shard over dp_shard x cp, so CP ranks average grads
            self.mesh  # noqa: B018 - built on first use
            return self.mesh[tuple(config.fsdp_dim_names)] if config.dp_replicate_enabled else config.submesh("dp_shard_cp")
        names = [n for n in ("dp_replicate", "dp_shard") if n in (self.mesh.mesh_dim_names or ())]
        if not names:  # e.g. tensor parallel only: FSDP over a mesh of one
            from torch.distributed.device_mesh import init_device_mesh

            return init_device_mesh(self.device.type, (1,), mesh_dim_names=("dp_shard",))
        return self.mesh[tuple(names)] if len(names) > 1 else self.mesh[names[0]]

    def _tensor_parallel_plan(self) -> Any:
        """The plan given through `ParallelismConfig(tp_handler=...)` (a dict, or an object with `tp_plan`); None: the model's own."""
        handler = getattr(self.parallelism_config, "tp_handler", None)
        return handler if isinstance(handler, dict) or handler is None else getattr(handler, "tp_plan", None)

    def data_parallel_layout(self, num_processes: int, process_index: int) -> tuple[int, int]:
        config = self.parallelism_config
        if config is None:
            return num_processes, process_index
        from ...data.mesh import data_parallel_share

        # Accelerate's rule, shared with prepare_data_loader(torch_device_mesh=...): processes of one tp/cp group
        # (innermost on the mesh) read the same batch; sp too (DeepSpeed's Ulysses cuts sequences over it)
        return data_parallel_share(config.sizes, process_index, same_batch=("tp", "cp", "sp"))

    def _mixed_precision_policy(self) -> Any:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        policy = self.plugin.fsdp2_precision()  # the Accelerator's precision, set in `create` as Accelerate sets it
        return policy if policy is not None else MixedPrecisionPolicy()

    # -- set-up -------------------------------------------------------------------------------------
    def setup_module(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import FSDPModule

        if isinstance(model, FSDPModule):
            raise ValueError("this model is already sharded with fully_shard; pass the plain module to prepare.")
        self.cast_forward(model)
        before = dict(model.named_parameters())
        on_meta = any(p.is_meta for p in before.values())
        rank = dist.get_rank() if dist.is_initialized() else 0
        broadcast = self.world_size > 1 and (self.plugin.cpu_ram_efficient_loading or self.plugin.sync_module_states)
        if on_meta and (rank == 0 or not broadcast):
            raise ValueError("the model's parameters are on the meta device; build it with real weights on the main "
                             "process and keep cpu_ram_efficient_loading=True so the others receive them.")
        # The main process's weights are the truth: kept before sharding, broadcast after. A model split
        # already (DTensors, e.g. transformers' tp_plan="auto") is gathered whole by every process (a collective).
        split = any(type(p).__name__ == "DTensor" for p in before.values())
        if split and self.parallelism_config is not None:  # before any collective: every process refuses alike
            from ..parallel.tp_size import check_model_tp_size

            check_model_tp_size(model, self.parallelism_config.tp_size)
        full_state = {k: getattr(v, "full_tensor", v.detach)().detach().to(self.device)
                      for k, v in model.state_dict().items()} if broadcast and (rank == 0 or split) else {}
        if rank != 0:
            full_state.clear()
        if not on_meta:
            model.to(self.device)
        names = self.mesh.mesh_dim_names or ()
        if "tp" in names and not split:
            from ..parallel.tensor import apply_tensor_parallel

            apply_tensor_parallel(model, self.mesh["tp"], self._tensor_parallel_plan())
        if self.shards:  # tensor parallel alone shards nothing more (Accelerate wraps nothing then)
            self._shard(model)
        if on_meta:
            _materialize(model, self.device, self.plugin.param_init_fn)
        if broadcast:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            set_model_state_dict(model, full_state,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
            full_state.clear()
        self._record_replaced_params(before, model)
        self._models.append(model)
        return model

    def _shard(self, model: nn.Module) -> None:
        """One `fully_shard` per wrap unit (innermost first), then the root, on the data-parallel mesh."""
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

        is_unit = wrap_unit_filter(self.plugin, model)
        self.plugin.set_auto_wrap_policy(model)  # what Accelerate's prepare leaves in the plugin (a bound partial)
        # Containers without a forward (ModuleList, ModuleDict) cannot be units; their children can.
        units = [m for m in model.modules() if m is not model and is_unit(m) and type(m).forward is not nn.Module.forward]
        if self.plugin.activation_checkpointing:
            from torch.distributed._composable import checkpoint  # keeps parameter names (no wrapper module)

            for unit in units or [model]:
                checkpoint(unit)
            if self.plugin.activation_checkpointing_offload:
                if self.device.type == "cpu":
                    notice_once("fsdp activation_checkpointing_offload: a CPU run keeps activations in CPU memory "
                                "already; nothing to offload.")
                else:
                    for unit in units or [model]:
                        offload_saved_inputs(unit)
        offload = self.plugin.offload_policy
        if isinstance(offload, CPUOffloadPolicy) and self.device.type == "cpu":
            notice_once("fsdp cpu_offload: the parameters already live in CPU memory on a CPU run; nothing to offload.")
            offload = OffloadPolicy()
        ignored = get_parameters_from_modules(self.plugin.ignored_modules, model, self.device) or None
        options = dict(mesh=self._data_parallel_mesh(), reshard_after_forward=self.plugin.reshards,
                       mp_policy=self._mixed_precision_policy(), offload_policy=offload, ignored_params=ignored)
        for unit in reversed(units):  # innermost first, so each unit owns only its own parameters
            fully_shard(unit, **options)
        # Backward starts with the root's parameters: resharding them after forward would only add an
        # all-gather per step (torch's default for the root; ~3% of a step of a 4-layer LM on gloo).
        if options["reshard_after_forward"] is True and units:
            options["reshard_after_forward"] = False
        fully_shard(model, **options)

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        optimizer = super().setup_optimizer(optimizer)
        self.model_of(optimizer)  # refuse now an optimizer over parameters no prepared model holds
        return optimizer

    def model_of(self, optimizer: torch.optim.Optimizer) -> nn.Module:
        """The prepared model whose parameters `optimizer` steps."""
        inner = getattr(optimizer, "optimizer", optimizer)
        params = {id(p) for group in inner.param_groups for p in group["params"]}
        for model in self._models:
            if any(id(p) in params for p in model.parameters()):
                return model
        raise ValueError("under FSDP an optimizer must step the parameters of a prepared model; "
                         "prepare the model (in this or an earlier prepare call) and build the optimizer on its parameters.")

    # -- the hot path -------------------------------------------------------------------------------
    def needs_fillers(self, model: nn.Module) -> bool:
        """FSDP2 gathers parameters in every forward and backward: every process must run as many."""
        return hasattr(model, "set_requires_gradient_sync")

    @contextlib.contextmanager
    def sync_on(self, model: nn.Module) -> Iterator[None]:
        """Reduce-scatter in this backward even inside `no_sync` (the block's end turns the sync on anyway)."""
        if not hasattr(model, "set_requires_gradient_sync"):
            yield
            return
        cast("FSDPModule", model).set_requires_gradient_sync(True)
        yield

    def no_sync(self, model: nn.Module) -> Any:
        if self.sync_each_batch or not hasattr(model, "set_requires_gradient_sync"):
            return super().no_sync(model)
        return _GradientSyncOff(cast("FSDPModule", model))

    # -- state ----------------------------------------------------------------------------------------
    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The full state dict, gathered on the main process (others get an empty dict); every process must call it."""
        return fsdp_checkpoint.full_model_state_dict(model)

    def load_model_state_dict(self, model: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
        fsdp_checkpoint.load_full_model_state_dict(model, state_dict)

    def optimizer_state_dict(self, optimizer: Any) -> dict[str, Any]:
        return fsdp_checkpoint.full_optimizer_state_dict(self.model_of(optimizer), getattr(optimizer, "optimizer", optimizer))

    def load_optimizer_state_dict(self, optimizer: Any, state_dict: dict[str, Any]) -> None:
        fsdp_checkpoint.load_full_optimizer_state_dict(self.model_of(optimizer), getattr(optimizer, "optimizer", optimizer),
                                                       state_dict)

    def model_gradients(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return fsdp_checkpoint.full_gradients(model)

    def load_model_gradients(self, model: nn.Module, gradients: dict[str, torch.Tensor]) -> None:
        fsdp_checkpoint.load_full_gradients(model, gradients)

    def save_checkpoint_files(self, directory: Path, models: Sequence[nn.Module],
                              optimizers: Sequence[torch.optim.Optimizer]) -> dict[str, int]:
        pairs = [(self.model_of(o), getattr(o, "optimizer", o)) for o in optimizers]
        return fsdp_checkpoint.save_sharded(directory, list(models), pairs)

    def begin_checkpoint_files(self, directory: Path, models: Sequence[nn.Module],
                               optimizers: Sequence[torch.optim.Optimizer]) -> Callable[[], dict[str, int]]:
        pairs = [(self.model_of(o), getattr(o, "optimizer", o)) for o in optimizers]
        return fsdp_checkpoint.begin_sharded(directory, list(models), pairs)

    def read_checkpoint_files(self, directory: Path, models: Sequence[nn.Module],
                              optimizers: Sequence[torch.optim.Optimizer]) -> ShardedState:
        pairs = [(self.model_of(o), getattr(o, "optimizer", o)) for o in optimizers]
        return fsdp_checkpoint.read_sharded(directory, list(models), pairs)

    def apply_checkpoint_files(self, contents: ShardedState) -> None:
        fsdp_checkpoint.apply_sharded(cast(fsdp_checkpoint.ShardedContents, contents))

