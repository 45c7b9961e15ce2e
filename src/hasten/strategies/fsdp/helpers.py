"""Accelerate's FSDP2 helper functions (its ``accelerate.utils.fsdp_utils`` names) on hasten's FSDP2 code.

`Accelerator.prepare` already does all of this for prepared models; these
are for scripts and libraries that call the peer's helpers themselves:
wrap-unit policies, activation checkpointing, sharding one model, loading a
full state dict into a sharded model, repointing an optimizer at the
sharded parameters, and the environment switches transformers reads.

Example:
    >>> fsdp2_canonicalize_names({"_orig_mod.layer._checkpoint_wrapped_module.weight": 1})
    {'layer.weight': 1}
"""

from __future__ import annotations

import functools
import os
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn

from ...runtime.modules import get_module_children_bottom_up, get_module_class_from_name, get_parameters_from_modules
from .plugin import FullyShardedDataParallelPlugin

if TYPE_CHECKING:
    from .strategy import FSDPStrategy

__all__ = [
    "enable_fsdp_ram_efficient_loading", "disable_fsdp_ram_efficient_loading", "ensure_weights_retied",
    "fsdp2_apply_ac", "fsdp2_canonicalize_names", "fsdp2_load_full_state_dict", "fsdp2_prepare_auto_wrap_policy",
    "fsdp2_prepare_model", "fsdp2_switch_optimizer_parameters", "get_fsdp2_grad_scaler", "get_parameters_from_modules",
]


# -- what transformers reads from the environment -------------------------------------------------------------
def enable_fsdp_ram_efficient_loading() -> None:
    """Tell transformers to load pretrained weights on the main process only (the others build on meta).

    Sets ``FSDP_CPU_RAM_EFFICIENT_LOADING=True`` and, unless already set,
    ``ACCELERATE_USE_FSDP=True`` (transformers' test for an FSDP run).

    Example:
        >>> from hasten.utils import patch_environment
        >>> with patch_environment(FSDP_CPU_RAM_EFFICIENT_LOADING="False"):
        ...     enable_fsdp_ram_efficient_loading(); os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"]
        'True'
    """
    os.environ.setdefault("ACCELERATE_USE_FSDP", "True")
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "True"


def disable_fsdp_ram_efficient_loading() -> None:
    """Tell transformers to load pretrained weights on every process (``FSDP_CPU_RAM_EFFICIENT_LOADING=False``).

    Example:
        >>> from hasten.utils import patch_environment
        >>> with patch_environment(FSDP_CPU_RAM_EFFICIENT_LOADING="True"):
        ...     disable_fsdp_ram_efficient_loading(); os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"]
        'False'
    """
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "False"


# -- small helpers ------------------------------------------------------------------------------------------------
def fsdp2_canonicalize_names(named_params: dict[str, Any]) -> dict[str, Any]:
    """The same mapping with the names wrappers add removed (activation checkpointing's, `torch.compile`'s).

    Example:
        >>> fsdp2_canonicalize_names({"_orig_mod.fc.weight": 0, "block._orig_mod.bias": 1})
        {'fc.weight': 0, 'block.bias': 1}
    """

    def plain(name: str) -> str:
        name = name.replace("._checkpoint_wrapped_module", "")
        name = name.removeprefix("_orig_mod.")
        return name.replace("._orig_mod", "")

    return {plain(name): value for name, value in named_params.items()}


def get_fsdp2_grad_scaler(**kwargs: Any) -> torch.amp.GradScaler:
    """A `torch.amp.GradScaler` built from `kwargs` (Accelerate's fp16 scaler for FSDP2).

    Example:
        >>> get_fsdp2_grad_scaler(device="cpu", enabled=False).is_enabled()
        False
    """
    return torch.amp.GradScaler(**kwargs)


def ensure_weights_retied(param_init_fn: Callable[[nn.Module], Any], model: nn.Module,
                          device: torch.device | str) -> Callable[[nn.Module], Any]:
    """`param_init_fn` wrapped so that parameters tied in `model` (its `_tied_weights_keys`) stay tied after it.

    An init function that gives each module new parameters (e.g. `to_empty`)
    would untie a shared weight; the wrapper remembers which parameter each
    tied name held and points every later holder at the first new one.
    Without tied keys, `param_init_fn` comes back unchanged.

    Example:
        >>> model = nn.Linear(2, 2)
        >>> init = lambda module: module
        >>> ensure_weights_retied(init, model, "cpu") is init
        True
    """
    tied_names = getattr(model, "_tied_weights_keys", None)
    if not tied_names:
        return param_init_fn
    # id of each tied parameter -> the parameter that replaces it (the first new one seen)
    replacement: dict[int, nn.Parameter | None] = {}
    for name in tied_names:
        owner, _, attribute = name.rpartition(".")
        replacement[id(getattr(model.get_submodule(owner), attribute))] = None

    def init_keeping_ties(module: nn.Module) -> Any:
        tied_here: dict[int, list[str]] = defaultdict(list)
        for name, parameter in module.named_parameters(recurse=False):
            if id(parameter) in replacement:
                tied_here[id(parameter)].append(name)
        module = param_init_fn(module)
        for key, names in tied_here.items():
            for name in names:
                if replacement[key] is None:
                    replacement[key] = getattr(module, name)
                else:
                    setattr(module, name, replacement[key])
        return module

    return init_keeping_ties


# -- wrap units, activation checkpointing ---------------------------------------------------------------------------
def fsdp2_prepare_auto_wrap_policy(fsdp2_plugin: FullyShardedDataParallelPlugin,
                                   model: nn.Module) -> Callable[[nn.Module], bool] | None:
    """Which submodules the plugin's `auto_wrap_policy` makes their own unit, as a ``module -> bool`` test.

    TRANSFORMER_BASED_WRAP: instances of the classes named by
    `transformer_cls_names_to_wrap`, else by the model's `_no_split_modules`
    (a module wrapped for activation checkpointing counts as what it wraps);
    SIZE_BASED_WRAP: modules with more than `min_num_params` parameters; a
    callable policy is returned as it is; NO_WRAP: None.

    Example:
        >>> plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap",
        ...                                         transformer_cls_names_to_wrap=["Linear"])
        >>> policy = fsdp2_prepare_auto_wrap_policy(plugin, nn.Sequential(nn.Linear(2, 2)))
        >>> policy(nn.Linear(3, 3)), policy(nn.ReLU())
        (True, False)
    """
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

    policy = fsdp2_plugin.auto_wrap_policy
    function = policy.func if isinstance(policy, functools.partial) else policy
    if policy == "TRANSFORMER_BASED_WRAP" or function is transformer_auto_wrap_policy:
        names = fsdp2_plugin.transformer_cls_names_to_wrap
        if names is None:
            names = list(getattr(model, "_no_split_modules", None) or [])
        classes = []
        for name in names:
            found = get_module_class_from_name(model, name)
            if found is None:
                raise ValueError(f"Could not find the transformer layer class {name} in the model; name a class the "
                                 "model contains in transformer_cls_names_to_wrap.")
            classes.append(found)
        wanted = tuple(classes)

        def by_class(module: nn.Module) -> bool:
            module = getattr(module, "_checkpoint_wrapped_module", module)
            return bool(wanted) and isinstance(module, wanted)

        return by_class
    if policy == "SIZE_BASED_WRAP" or function is size_based_auto_wrap_policy:
        threshold = fsdp2_plugin.min_num_params or 0
        return lambda module: sum(p.numel() for p in module.parameters()) > threshold
    if callable(policy):
        return policy
    return None


def _fsdp_plugin(accelerator: Any) -> FullyShardedDataParallelPlugin:
    plugin = getattr(getattr(accelerator, "state", None), "fsdp_plugin", None)
    if plugin is None:
        raise ValueError("this needs an Accelerator configured for FSDP (its state.fsdp_plugin is None); create it "
                         "with fsdp_plugin=FullyShardedDataParallelPlugin(...) or launch with --use_fsdp.")
    return plugin


def fsdp2_apply_ac(accelerator: Any, model: nn.Module) -> nn.Module:
    """Wrap each wrap-unit submodule (the plugin's policy) for activation checkpointing; returns `model`.

    With the plugin's `activation_checkpointing_offload`, each checkpointed
    layer's saved input also waits for backward in CPU memory.

    Example:
        >>> from types import SimpleNamespace
        >>> plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap",
        ...                                         transformer_cls_names_to_wrap=["Linear"])
        >>> accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin))
        >>> model = fsdp2_apply_ac(accelerator, nn.Sequential(nn.Linear(2, 2)))
        >>> type(model[0]).__name__
        'CheckpointWrapper'
    """
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper, offload_wrapper

    plugin = _fsdp_plugin(accelerator)
    policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
    if policy is None:
        return model
    for name, layer in get_module_children_bottom_up(model, return_fqns=True)[:-1]:  # not the model itself
        if policy(layer):
            wrapped: nn.Module = checkpoint_wrapper(layer, preserve_rng_state=False)
            if plugin.activation_checkpointing_offload:
                wrapped = offload_wrapper(wrapped)
            model.set_submodule(name, wrapped)
    return model


# -- sharding one model, loading into it, repointing optimizers ---------------------------------------------------
def _fsdp_strategy(accelerator: Any) -> FSDPStrategy:
    from .strategy import FSDPStrategy

    strategy = getattr(accelerator, "strategy", None)
    if not isinstance(strategy, FSDPStrategy):
        raise ValueError("fsdp2_prepare_model needs an Accelerator whose run is sharded by FSDP (more than one "
                         "process and an fsdp_plugin); launch with --use_fsdp or pass fsdp_plugin=.")
    return strategy


def fsdp2_prepare_model(accelerator: Any, model: nn.Module) -> nn.Module:
    """Shard `model` with FSDP2 exactly as `accelerator.prepare` would (wrap units, mesh, precision, weights).

    A model that is already sharded (or compiled around a sharded one) comes
    back unchanged. Collective: call it on every process.

    Example:
        >>> from types import SimpleNamespace
        >>> fsdp2_prepare_model(SimpleNamespace(strategy=None), nn.Linear(2, 2))
        Traceback (most recent call last):
        ...
        ValueError: fsdp2_prepare_model needs an Accelerator whose run is sharded by FSDP (more than one process and an fsdp_plugin); launch with --use_fsdp or pass fsdp_plugin=.
    """
    from torch.distributed.fsdp import FSDPModule

    inner = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    if isinstance(inner, FSDPModule):
        return model
    return _fsdp_strategy(accelerator).setup_module(model)


def fsdp2_load_full_state_dict(accelerator: Any, model: nn.Module, full_sd: dict[str, torch.Tensor],
                               cpu_offload: bool = False) -> nn.Module:
    """Load a full state dict, held by the main process only, into the sharded `model` (in place; also returned).

    The main process sends each tensor to every process, which keeps its
    shard (cast to the model's dtype for floating tensors); the model may be
    on the meta device. `cpu_offload` leaves the shards in CPU memory (for
    FSDP's CPU offload). Collective: call it on every process; the other
    processes' `full_sd` is not read.

    Example:
        >>> from types import SimpleNamespace
        >>> fsdp2_load_full_state_dict(SimpleNamespace(is_main_process=True), nn.Linear(2, 2), {})
        Traceback (most recent call last):
        ...
        KeyError: "fsdp2_load_full_state_dict: the model has weight, bias, which the main process's full state dict lacks; pass the complete state dict on the main process."
    """
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, distribute_tensor

    sharded_keys = model.state_dict()
    missing = [key for key in sharded_keys if key not in full_sd] if accelerator.is_main_process else []
    if dist.is_initialized() and dist.get_world_size() > 1:  # every process refuses alike, before any transfer
        shared = [missing]
        dist.broadcast_object_list(shared, src=0)
        missing = shared[0]
    if missing:
        raise KeyError(f"fsdp2_load_full_state_dict: the model has {', '.join(missing[:5])}, which the main process's "
                       f"full state dict lacks; pass the complete state dict on the main process.")
    loaded = {}
    for key, target in sharded_keys.items():
        mesh = target.device_mesh if isinstance(target, DTensor) else None
        device = mesh.device_type if mesh is not None else target.device.type
        if device == "meta":
            device = accelerator.device.type
        if accelerator.is_main_process:  # every process sends/receives the model's dtype, so the sizes agree
            full = full_sd[key].detach()
            full = (full.full_tensor() if isinstance(full, DTensor) else full).to(device=device, dtype=target.dtype)
        else:
            full = torch.empty(target.shape, dtype=target.dtype, device=device)
        if dist.is_initialized():
            dist.broadcast(full, src=0)
        value = distribute_tensor(full, mesh, target.placements) if mesh is not None else full
        loaded[key] = value.to("cpu") if cpu_offload else value
    model.load_state_dict(loaded, assign=True)  # the model may sit on meta: take the new tensors as they are
    return model


def _pointer(parameter: torch.Tensor) -> int:
    """The data pointer a parameter is known by: Accelerate's remembered one, else its (local shard's) storage."""
    remembered = getattr(parameter, "data_ptr", None)
    if isinstance(remembered, int):
        return remembered
    local = getattr(parameter, "_local_tensor", parameter)
    return int(local.data_ptr())


def fsdp2_switch_optimizer_parameters(optimizer: torch.optim.Optimizer, mapping: dict[int, torch.Tensor]) -> None:
    """Point `optimizer`'s param groups at the sharded parameters (`mapping`: old data pointer -> new parameter).

    A parameter without a replacement raises KeyError and the optimizer is
    left unchanged (training on the unsharded tensors would silently
    update nothing the model uses).

    Example:
        >>> old, new = nn.Parameter(torch.ones(1)), nn.Parameter(torch.zeros(1))
        >>> optimizer = torch.optim.SGD([old], lr=0.1)
        >>> fsdp2_switch_optimizer_parameters(optimizer, {old.data_ptr(): new})
        >>> optimizer.param_groups[0]["params"][0] is new
        True
    """
    switched = []
    for group in optimizer.param_groups:
        try:
            switched.append([mapping[_pointer(p)] for p in group["params"]])
        except KeyError:
            raise KeyError("a parameter of the optimizer has no sharded counterpart in the mapping, so training would "
                           "not update the model; build the optimizer from the model's parameters (or prepare them "
                           "together).") from None
    for group, params in zip(optimizer.param_groups, switched):
        group["params"] = params
