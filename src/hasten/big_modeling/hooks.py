"""Forward hooks that bring a block's weights in just before it runs and send them away right after.

A hook wraps `module.forward`: `pre_forward` may rewrite the inputs (and
load weights), `post_forward` may rewrite the output (and unload weights).
Offloading hooks keep the module's tensors on `meta` between calls, so a
model bigger than memory runs one block at a time.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any, Callable, cast

import torch
from torch import nn

from ..runtime.collectives import send_to_device
from ..runtime.memory import clear_device_cache
from .bnb_checkpoint import scales_for
from .offload import OffloadedWeightsLoader, PrefixedDataset, announce_offloaded_module
from .sizes import get_non_persistent_buffers, named_module_tensors, set_module_tensor_to_device

__all__ = ["ModelHook", "SequentialHook", "add_hook_to_module", "remove_hook_from_module", "AlignDevicesHook",
           "attach_execution_device_hook", "attach_align_device_hook", "attach_align_device_hook_on_blocks",
           "remove_hook_from_submodules", "CpuOffload", "UserCpuOffloadHook"]

_META = torch.device("meta")


class ModelHook:
    """Base class for forward hooks; every method is a no-op to override.

    Set `no_grad = True` on a subclass to run the wrapped forward without autograd.

    Example:
        >>> class Double(ModelHook):
        ...     def post_forward(self, module, output):
        ...         return output * 2
        >>> m = add_hook_to_module(torch.nn.Identity(), Double())
        >>> m(torch.ones(1))
        tensor([2.])
    """

    no_grad = False

    def init_hook(self, module: nn.Module) -> nn.Module:  # on attach; returns the (possibly changed) module
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:  # -> inputs to use
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:  # -> output the caller gets
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:  # on removal: undo init_hook
        return module


class SequentialHook(ModelHook):
    """Several hooks applied one after the other, in the order given (for pre- and post-forward alike).

    Example:
        >>> hook = SequentialHook(ModelHook(), ModelHook())
        >>> len(hook.hooks)
        2
    """

    def __init__(self, *hooks: ModelHook) -> None:
        self.hooks = hooks

    @property
    def no_grad(self) -> bool:  # type: ignore[override]
        # One member asking for no autograd is enough: they share one forward call.
        return any(hook.no_grad for hook in self.hooks)

    def init_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module


def _hooked_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    # Plain attributes add_hook_to_module set on the module (nn.Module types its attributes as tensors or modules).
    hook = cast(ModelHook, module._hf_hook)
    old_forward = cast(Callable[..., Any], module._old_forward)
    args, kwargs = hook.pre_forward(module, *args, **kwargs)
    if hook.no_grad:
        with torch.no_grad():
            output = old_forward(*args, **kwargs)
    else:
        output = old_forward(*args, **kwargs)
    return hook.post_forward(module, output)


def _is_graph_module(module: nn.Module) -> bool:
    return "GraphModuleImpl" in str(type(module))  # torch.fx: a class per GraphModule, forward looked up on it


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False) -> nn.Module:
    """Wrap `module.forward` with `hook`; the original forward is kept in `module._old_forward`.

    With `append=True` and a hook already there, both run (old first) as a
    `SequentialHook`; otherwise the new hook replaces the old one (which is
    not detached). `hook.no_grad` runs the original forward under `torch.no_grad()`.

    Example:
        >>> m = add_hook_to_module(torch.nn.Linear(2, 2), ModelHook())
        >>> hasattr(m, "_hf_hook") and hasattr(m, "_old_forward")
        True
    """
    existing = getattr(module, "_hf_hook", None)
    if append and existing is not None:
        # The old hook is already initialised: only the new one needs init_hook.
        # (Detaching and re-initialising it could load every offloaded weight at once.)
        module = hook.init_hook(module)
        setattr(module, "_hf_hook", SequentialHook(existing, hook))
        return module
    # Replacing a hook keeps the forward saved by the first one (the old hook is not detached).
    old_forward: Callable[..., Any] = getattr(module, "_old_forward") if hasattr(module, "_old_forward") else module.forward
    setattr(module, "_old_forward", old_forward)
    module = hook.init_hook(module)
    setattr(module, "_hf_hook", hook)
    wrapped = functools.update_wrapper(functools.partial(_hooked_forward, module), old_forward)
    if _is_graph_module(module):
        module.__class__.forward = wrapped
    else:
        module.forward = wrapped
    return module


def remove_hook_from_module(module: nn.Module, recurse: bool = False) -> nn.Module:
    """Detach the hook of `module` (and of all submodules with `recurse=True`) and restore its forward.

    A forward that came from the class is restored by dropping the instance
    attribute, so `module.forward` is the class method again.

    Example:
        >>> m = add_hook_to_module(torch.nn.Linear(2, 2), ModelHook())
        >>> "forward" in remove_hook_from_module(m).__dict__
        False
    """
    hook = module.__dict__.get("_hf_hook")
    if hook is not None:
        hook.detach_hook(module)
        del module._hf_hook
    if "_old_forward" in module.__dict__:
        old = module.__dict__.pop("_old_forward")
        if _is_graph_module(module):
            module.__class__.forward = old
        elif getattr(old, "__self__", None) is module and getattr(old, "__func__", None) is getattr(type(module), "forward", None):
            module.__dict__.pop("forward", None)
        else:
            module.forward = old
    for name in [name for name, value in module.__dict__.items() if getattr(value, "_accelerate_added_attribute", False)]:
        module.__dict__.pop(name)  # `dispatch_model`'s guarded moves
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse=True)
    return module


def _first_device(data: Any) -> torch.device | None:
    """Device of the first tensor found in a nested structure of inputs."""
    if isinstance(data, torch.Tensor):
        return data.device
    items = data.values() if isinstance(data, Mapping) else data if isinstance(data, (list, tuple)) else ()
    return next((d for d in map(_first_device, items) if d is not None), None)


class AlignDevicesHook(ModelHook):
    """Run a module on `execution_device`; with `offload=True` its weights live elsewhere between calls.

    - Inputs are sent to `execution_device`; with `io_same_device` the output
      goes back to the device of the first input tensor.
    - Without offload, the module's own tensors are moved to `execution_device`
      when attached (all submodules' too with `place_submodules`).
    - With offload, the tensors are replaced by `meta` ones when attached;
      each forward fetches them from `weights_map` (a state dict or an
      `OffloadedWeightsLoader`) and puts them back on `meta` right after, so
      nothing stays resident. Buffers follow only with `offload_buffers`.
    - `tied_params_map` (pointer -> {device: tensor}) lets tied weights share
      one copy on the execution device.

    Example:
        >>> lin = torch.nn.Linear(2, 2)
        >>> weights = {k: v.clone() for k, v in lin.state_dict().items()}
        >>> lin = add_hook_to_module(lin, AlignDevicesHook("cpu", offload=True, weights_map=weights))
        >>> lin.weight.device, lin(torch.ones(2)).shape, lin.weight.device
        (device(type='meta'), torch.Size([2]), device(type='meta'))
    """

    def __init__(self, execution_device: int | str | torch.device | None = None, offload: bool = False,
                 io_same_device: bool = False, weights_map: Mapping | None = None, offload_buffers: bool = False,
                 place_submodules: bool = False, skip_keys: str | list[str] | None = None,
                 tied_params_map: dict[int, dict[torch.device, torch.Tensor]] | None = None) -> None:
        # Any: the device is an index, a name or a torch.device; the maps are filled lazily (init_hook) and read per forward.
        self.execution_device: Any = execution_device
        self.offload, self.io_same_device = offload, io_same_device
        self.weights_map: Any = weights_map
        self.offload_buffers, self.place_submodules = offload_buffers, place_submodules
        self.skip_keys = skip_keys
        self.tied_params_map: Any = tied_params_map
        self.input_device: torch.device | None = None
        self.original_devices: dict[str, torch.device] = {}
        self.tied_params_names: set[str] = set()
        self.tied_pointers_to_remove: set[tuple[int, Any]] = set()

    def __repr__(self) -> str:
        return (f"AlignDevicesHook(execution_device={self.execution_device}, offload={self.offload}, "
                f"io_same_device={self.io_same_device}, offload_buffers={self.offload_buffers}, "
                f"place_submodules={self.place_submodules}, skip_keys={self.skip_keys!r})")

    def _offloaded(self, module: nn.Module) -> list[tuple[str, torch.Tensor]]:
        return list(named_module_tensors(module, include_buffers=self.offload_buffers, recurse=self.place_submodules,
                                         remove_non_persistent=True))

    def init_hook(self, module: nn.Module) -> nn.Module:
        device = self.execution_device
        if not self.offload:
            if device is not None:
                for name, _ in named_module_tensors(module, recurse=self.place_submodules):
                    set_module_tensor_to_device(module, name, device, tied_params_map=self.tied_params_map, clear_cache=False)
            return module
        self.original_devices = {name: t.device for name, t in named_module_tensors(module, recurse=self.place_submodules)}
        if self.weights_map is None:
            # No external copy given: the current tensors become the offloaded copy (no copy when already on CPU).
            self.weights_map = {name: t.to("cpu") for name, t in named_module_tensors(
                module, include_buffers=self.offload_buffers, recurse=self.place_submodules)}
        for name, tensor in self._offloaded(module):
            if self.tied_params_map is not None and tensor.data_ptr() in self.tied_params_map:
                self.tied_params_names.add(name)
            set_module_tensor_to_device(module, name, "meta")
        if device is not None:
            # Buffers not offloaded (all of them, or just the non-persistent ones) live on the execution device.
            names = (get_non_persistent_buffers(module, self.place_submodules, fqns=True) if self.offload_buffers
                     else [name for name, _ in module.named_buffers(recurse=self.place_submodules)])
            for name in names:
                set_module_tensor_to_device(module, name, device, tied_params_map=self.tied_params_map, clear_cache=False)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        if self.io_same_device:
            self.input_device = _first_device([args, kwargs])
        if self.offload:
            self.tied_pointers_to_remove = set()
            buffers = {name for name, _ in module.named_buffers(recurse=self.place_submodules)}
            on_cpu = self.execution_device is not None and torch.device(self.execution_device).type == "cpu"
            names = [name for name, _ in self._offloaded(module)]
            for name in names:
                value = self.weights_map[name]
                if name in buffers and on_cpu and _is_mapped(self.weights_map, name):
                    # Forward may update a buffer in place (BatchNorm statistics): never write into a read-only mapping.
                    value = value.clone()
                tied = self.tied_params_map
                if tied is not None:
                    pointer = value.data_ptr()
                    if name in self.tied_params_names and pointer not in tied:
                        tied[pointer] = {}
                    if pointer in tied and self.execution_device not in tied[pointer]:
                        # This call creates the shared on-device copy; post_forward forgets it again.
                        self.tied_pointers_to_remove.add((pointer, self.execution_device))
                # On CPU with matching dtype a memory-mapped weight is used as is, without a copy.
                set_module_tensor_to_device(module, name, self.execution_device, value=value, tied_params_map=tied,
                                            fp16_statistics=scales_for(self.weights_map, name, value), clear_cache=False)
                del value
            announce_offloaded_module(self.weights_map, names)
        if self.execution_device is None:
            return args, kwargs
        return (send_to_device(args, self.execution_device),
                send_to_device(kwargs, self.execution_device, skip_keys=self.skip_keys))

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        if self.offload:
            # Dropping the module's references lets a memory-mapped weight's pages be unmapped.
            for name, _ in self._offloaded(module):
                set_module_tensor_to_device(module, name, "meta")
            for pointer, device in self.tied_pointers_to_remove:
                self.tied_params_map[pointer].pop(device, None)
            self.tied_pointers_to_remove = set()
        if self.io_same_device and self.input_device is not None:
            output = send_to_device(output, self.input_device, skip_keys=self.skip_keys)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        if self.offload:
            for name, device in self.original_devices.items():
                if device != _META:
                    value = self.weights_map.get(name, None)
                    if value is not None and _is_mapped(self.weights_map, name):
                        value = value.clone()  # the module owns writable memory again, not a read-only file mapping
                    set_module_tensor_to_device(module, name, device, value=value, clear_cache=False)
        return module


def _is_mapped(weights_map: Mapping, name: str) -> bool:
    """Whether `weights_map[name]` is a read-only memory-mapped ``.dat`` file (seen through any prefixes)."""
    inner: Any = weights_map
    while isinstance(inner, PrefixedDataset):
        inner, name = inner.dataset, inner.prefix + name
    return (isinstance(inner, OffloadedWeightsLoader) and name not in inner.state_dict
            and inner.index.get(name, {}).get("safetensors_file") is None)


def attach_execution_device_hook(module: nn.Module, execution_device: int | str | torch.device,
                                 skip_keys: str | list[str] | None = None, preload_module_classes: list[str] | None = None,
                                 tied_params_map: dict | None = None) -> None:
    """Give `module` and every submodule with tensors (and no hook yet) a hook sending inputs to `execution_device`.

    Recursion stops below modules whose class name is in `preload_module_classes`.

    Example:
        >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> attach_execution_device_hook(m, "cpu")
        >>> hasattr(m[0], "_hf_hook")
        True
    """
    if not hasattr(module, "_hf_hook") and len(module.state_dict()) > 0:
        add_hook_to_module(module, AlignDevicesHook(execution_device, skip_keys=skip_keys, tied_params_map=tied_params_map))
    if preload_module_classes is not None and type(module).__name__ in preload_module_classes:
        return
    for child in module.children():
        attach_execution_device_hook(child, execution_device, skip_keys, preload_module_classes, tied_params_map)


def attach_align_device_hook(module: nn.Module, execution_device: int | str | torch.device | None = None,
                             offload: bool = False, weights_map: Mapping | None = None, offload_buffers: bool = False,
                             module_name: str = "", skip_keys: str | list[str] | None = None,
                             preload_module_classes: list[str] | None = None, tied_params_map: dict | None = None) -> None:
    """Add an `AlignDevicesHook` to every submodule owning tensors directly (appended to existing hooks).

    `weights_map` is keyed from the root; each hook sees it through a prefix of
    `module_name`. A module whose class is in `preload_module_classes` gets one
    hook for all its weights (loaded together) and its children none.

    Example:
        >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> attach_align_device_hook(m, "cpu", offload=True, weights_map=dict(m.state_dict()))
        >>> m[0].weight.device
        device(type='meta')
    """
    full_offload = offload and preload_module_classes is not None and type(module).__name__ in preload_module_classes
    if full_offload or next(iter(named_module_tensors(module)), None) is not None:
        prefixed = None if weights_map is None else PrefixedDataset(weights_map, f"{module_name}." if module_name else "")
        add_hook_to_module(module, AlignDevicesHook(execution_device, offload, weights_map=prefixed,
                                                    offload_buffers=offload_buffers, place_submodules=full_offload,
                                                    skip_keys=skip_keys, tied_params_map=tied_params_map), append=True)
    if full_offload:
        return
    for child_name, child in module.named_children():
        attach_align_device_hook(child, execution_device, offload, weights_map, offload_buffers,
                                 _join(module_name, child_name), skip_keys, preload_module_classes, tied_params_map)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def attach_align_device_hook_on_blocks(module: nn.Module, execution_device: Any = None, offload: Any = None,
                                       weights_map: Mapping | None = None, offload_buffers: bool = False,
                                       module_name: str = "", skip_keys: str | list[str] | None = None,
                                       preload_module_classes: list[str] | None = None,
                                       tied_params_map: dict | None = None) -> None:
    """Hook the blocks of a device map: `execution_device` and `offload` are per-module-name dicts (or single values).

    A block not offloaded gets one hook placing all its tensors on its device;
    an offloaded block gets per-submodule offloading hooks; the root hook
    returns outputs on the input's device.

    Example:
        >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
        >>> attach_align_device_hook_on_blocks(m, {"0": "cpu", "1": "cpu"}, {"0": False, "1": True},
        ...                                    weights_map=dict(m.state_dict()))
        >>> m[0].weight.device, m[1].weight.device
        (device(type='cpu'), device(type='meta'))
    """
    hook = functools.partial(AlignDevicesHook, skip_keys=skip_keys, tied_params_map=tied_params_map)
    if not isinstance(execution_device, Mapping) and not isinstance(offload, Mapping):
        # One device and one offload flag for the whole module.
        if offload:
            attach_align_device_hook(module, execution_device, True, weights_map, offload_buffers, module_name,
                                     skip_keys, tied_params_map=tied_params_map)
        else:
            add_hook_to_module(module, hook(execution_device, io_same_device=True, place_submodules=True))
        return
    if not isinstance(execution_device, Mapping):
        execution_device = {key: execution_device for key in offload}
    if not isinstance(offload, Mapping):
        offload = {key: offload for key in execution_device}

    is_root = module_name == ""
    if module_name in execution_device and module_name in offload:
        device = execution_device[module_name]
        if not offload[module_name]:
            add_hook_to_module(module, hook(device, offload_buffers=offload_buffers, io_same_device=is_root,
                                            place_submodules=True))
            attach_execution_device_hook(module, device, skip_keys, tied_params_map=tied_params_map)
        else:
            attach_align_device_hook(module, device, True, weights_map, offload_buffers, module_name, skip_keys,
                                     preload_module_classes, tied_params_map)
            if not hasattr(module, "_hf_hook"):
                add_hook_to_module(module, hook(device, io_same_device=is_root))
            attach_execution_device_hook(module, device, skip_keys, preload_module_classes, tied_params_map)
    elif is_root:
        add_hook_to_module(module, hook(execution_device.get(""), io_same_device=True))
    for child_name, child in module.named_children():
        attach_align_device_hook_on_blocks(child, execution_device, offload, weights_map, offload_buffers,
                                           _join(module_name, child_name), skip_keys, preload_module_classes,
                                           tied_params_map)


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Remove the hooks of every submodule of `module` (not of `module` itself).

    Example:
        >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> _ = add_hook_to_module(m[0], ModelHook())
        >>> remove_hook_from_submodules(m)
        >>> hasattr(m[0], "_hf_hook")
        False
    """
    for child in module.children():
        remove_hook_from_module(child)
        remove_hook_from_submodules(child)


def _default_device() -> torch.device:
    from ..process.topology import select_device  # this process's accelerator, else CPU

    return select_device(int(os.environ.get("LOCAL_RANK", "0") or 0))


class CpuOffload(ModelHook):
    """Keep a whole model on CPU and move it to `execution_device` when it is called.

    It stays there until `prev_module_hook` of the next model offloads it
    (pipelines of models run one after the other).

    Example:
        >>> hook = CpuOffload(execution_device="cpu")
        >>> m = add_hook_to_module(torch.nn.Linear(2, 2), hook)
        >>> m(torch.ones(2)).device
        device(type='cpu')
    """

    def __init__(self, execution_device: str | int | torch.device | None = None,
                 prev_module_hook: UserCpuOffloadHook | None = None) -> None:
        self.prev_module_hook = prev_module_hook
        self.execution_device: Any = execution_device if execution_device is not None else _default_device()

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to("cpu")

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        if self.prev_module_hook is not None:
            self.prev_module_hook.offload()
            clear_device_cache()
        module.to(self.execution_device)
        return send_to_device(args, self.execution_device), send_to_device(kwargs, self.execution_device)


class UserCpuOffloadHook:
    """Handle returned by `cpu_offload_with_hook`: `offload()` sends the model back to CPU, `remove()` unhooks it.

    Example:
        >>> m = torch.nn.Linear(2, 2)
        >>> handle = UserCpuOffloadHook(add_hook_to_module(m, CpuOffload("cpu")), m._hf_hook)
        >>> handle.offload(); handle.remove()
    """

    def __init__(self, model: nn.Module, hook: ModelHook) -> None:
        self.model, self.hook = model, hook

    def offload(self) -> None:  # back to CPU
        self.hook.init_hook(self.model)

    def remove(self) -> None:  # unhook the model
        remove_hook_from_module(self.model)
