"""Build models without memory, spread them over devices, offload the rest, load checkpoints into them.

`init_empty_weights` gives a model whose parameters are on `meta`;
`load_checkpoint_and_dispatch` then fills it tensor by tensor following a
device map and hooks the blocks that live on CPU or disk so that their
weights are brought in only while they run.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any, cast

import torch
from torch import nn

from ..logging import get_logger
from ..core.environment import parse_flag_from_env
from ..process.launch_spec import INIT_INCLUDE_BUFFERS_ENV, PEER_INIT_INCLUDE_BUFFERS_ENV
from ..core.objects import recursive_getattr
from .device_map import check_device_map, get_balanced_memory, infer_auto_device_map
from .hooks import (
    AlignDevicesHook,
    CpuOffload,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
)
from .loading import load_checkpoint_in_model
from .offload import (
    OffloadedWeightsLoader,
    extract_submodules_state_dict,
    offload_state_dict,
)
from .sizes import find_tied_parameters, retie_parameters

__all__ = [
    "init_empty_weights",
    "init_on_device",
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "dispatch_model",
    "load_checkpoint_and_dispatch",
]

logger = get_logger(__name__)

_DEVICE_MAP_STRINGS = ("auto", "balanced", "balanced_low_0", "sequential")


def _include_buffers_default() -> bool:
    return parse_flag_from_env(INIT_INCLUDE_BUFFERS_ENV) or parse_flag_from_env(PEER_INIT_INCLUDE_BUFFERS_ENV)


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool | None = None) -> Iterator[None]:
    """Create models whose parameters (and buffers with `include_buffers=True`) are on `meta`: no memory used.

    `include_buffers` defaults to the ``HASTEN_INIT_INCLUDE_BUFFERS`` (or
    ``ACCELERATE_INIT_INCLUDE_BUFFERS``) flag, else False.

    Example:
        >>> with init_empty_weights():
        ...     model = torch.nn.Linear(10_000, 10_000)
        >>> model.weight.device
        device(type='meta')
    """
    with init_on_device(torch.device("meta"), include_buffers=include_buffers) as handle:
        yield handle


@contextlib.contextmanager
def init_on_device(device: torch.device | str, include_buffers: bool | None = None) -> Iterator[None]:
    """Create the parameters (and buffers with `include_buffers=True`) of new modules on `device`.

    With `include_buffers=True` the block runs inside torch's own device
    context (``with torch.device(device):``), so every tensor created there
    lands on `device` and nothing of torch is patched. Otherwise only
    `nn.Module.register_parameter` is patched for the duration of the block;
    the original comes back on exit, errors included.

    Example:
        >>> with init_on_device("cpu"):
        ...     layer = torch.nn.Linear(2, 2)
        >>> layer.weight.device
        device(type='cpu')
    """
    if include_buffers is None:
        include_buffers = _include_buffers_default()
    device = torch.device(device)
    if include_buffers:
        # torch's device context places parameters, buffers and bare tensors alike, as Accelerate does on torch >= 2
        with device:
            yield
        return
    original_parameter = nn.Module.register_parameter

    def register_parameter(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original_parameter(module, name, param)
        if param is None:
            return
        param = cast(nn.Parameter, module._parameters[name])  # just registered: not None
        if param.device == device:  # already there (e.g. registered twice to tie it): keep the very same object
            return
        cls, extra = type(param), dict(param.__dict__)
        moved = param.to(device)
        try:  # Parameter subclasses (e.g. quantized ones) may need their attributes as constructor arguments.
            module._parameters[name] = cls(moved, **{**extra, "requires_grad": param.requires_grad})
        except TypeError:
            new = cls(moved, requires_grad=param.requires_grad)
            new.__dict__.update(extra)
            module._parameters[name] = new

    try:
        setattr(nn.Module, "register_parameter", register_parameter)
        yield
    finally:
        setattr(nn.Module, "register_parameter", original_parameter)


def _first_parameter_device(model: nn.Module) -> torch.device:
    return next(iter(model.parameters())).device


def cpu_offload(model: nn.Module, execution_device: torch.device | str | int | None = None, offload_buffers: bool = False,
                state_dict: dict[str, torch.Tensor] | None = None,
                preload_module_classes: list[str] | None = None) -> nn.Module:
    """Keep the weights on CPU (in `state_dict`) and bring each submodule's in to `execution_device` as it runs.

    `execution_device` defaults to the device of the first parameter; the
    output comes back on the input's device.

    Example:
        >>> model = cpu_offload(torch.nn.Sequential(torch.nn.Linear(2, 2)), execution_device="cpu")
        >>> model[0].weight.device, model(torch.ones(2)).shape
        (device(type='meta'), torch.Size([2]))
    """
    if execution_device is None:
        execution_device = _first_parameter_device(model)
    if state_dict is None:
        state_dict = {name: tensor.to("cpu") for name, tensor in model.state_dict().items()}
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    attach_align_device_hook(model, execution_device=execution_device, offload=True, offload_buffers=offload_buffers,
                             weights_map=state_dict, preload_module_classes=preload_module_classes)
    return model


def cpu_offload_with_hook(model: nn.Module, execution_device: int | str | torch.device | None = None,
                          prev_module_hook: UserCpuOffloadHook | None = None) -> tuple[nn.Module, UserCpuOffloadHook]:
    """Offload a whole model to CPU; it moves to `execution_device` when called and stays until offloaded.

    Returns the model and a hook whose `offload()` sends it back; pass that
    hook as `prev_module_hook` of the next model in a pipeline.

    Example:
        >>> model, hook = cpu_offload_with_hook(torch.nn.Linear(2, 2), execution_device="cpu")
        >>> _ = model(torch.ones(2)); hook.offload()
    """
    hook = CpuOffload(execution_device=execution_device, prev_module_hook=prev_module_hook)
    add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)


def disk_offload(model: nn.Module, offload_dir: str | os.PathLike[str], execution_device: torch.device | str | int | None = None,
                 offload_buffers: bool = False, preload_module_classes: list[str] | None = None) -> nn.Module:
    """Write the weights to `offload_dir` (unless an `index.json` is there) and memory-map them in per forward.

    Example:
        >>> import tempfile
        >>> model = disk_offload(torch.nn.Sequential(torch.nn.Linear(2, 2)), tempfile.mkdtemp(), "cpu")
        >>> model(torch.ones(2)).shape
        torch.Size([2])
    """
    offload_dir = os.fspath(offload_dir)
    if not os.path.isfile(os.path.join(offload_dir, "index.json")):
        offload_state_dict(offload_dir, model.state_dict())
    if execution_device is None:
        execution_device = _first_parameter_device(model)
    weights_map = OffloadedWeightsLoader(save_folder=offload_dir)
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    attach_align_device_hook(model, execution_device=execution_device, offload=True, offload_buffers=offload_buffers,
                             weights_map=weights_map, preload_module_classes=preload_module_classes)
    return model


def _guard_moves(model: nn.Module) -> None:
    """Wrap `model.to` (and the accelerator's own move, `.cuda` on CUDA) so moving a dispatched model warns, and
    fails while weights are offloaded; the wrappers are marked for `remove_hook_from_module` (Accelerate 1.16's)."""

    def guarded(method: Any) -> Any:
        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if method.__name__ != "to" or torch._C._nn._parse_to(*args, **kwargs)[0] is not None:
                logger.warning("Moving a model dispatched with hooks can break them; remove the hooks first.")
            if any(p.device.type == "meta" for p in model.parameters()):
                raise RuntimeError("This model has modules offloaded to cpu or disk (their weights are on meta), "
                                   "so it cannot be moved.")
            return method(*args, **kwargs)

        wrapper._accelerate_added_attribute = True  # type: ignore[attr-defined]
        return wrapper

    from ..core.accelerators import get_torch_accelerator_backend

    device_type, _ = get_torch_accelerator_backend()
    for name in ("to", *([device_type] if device_type else [])):
        if hasattr(model, name):
            setattr(model, name, guarded(getattr(model, name)))


def dispatch_model(model: nn.Module, device_map: dict[str, int | str | torch.device],
                   main_device: int | str | torch.device | None = None,
                   state_dict: dict[str, torch.Tensor] | None = None, offload_dir: str | os.PathLike[str] | None = None,
                   offload_index: dict[str, dict] | None = None, offload_buffers: bool = False,
                   skip_keys: str | list[str] | None = None, preload_module_classes: list[str] | None = None,
                   force_hooks: bool = False) -> nn.Module:
    """Place each block of `model` as `device_map` says and hook it so forward works across devices.

    Blocks mapped to a device are moved there; "disk" blocks (and "cpu" ones
    when the main device is an accelerator) keep their weights off-device and
    load them per forward on `main_device`. On a CPU-only map the main device
    is "cpu" and disk weights are memory-mapped from `offload_dir`. With a
    single device other than "disk" and no `force_hooks`, the model is
    simply moved there.
    Sets `model.hf_device_map`.

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
        >>> model = dispatch_model(model, {"0": "cpu", "1": "cpu"})
        >>> model.hf_device_map
        {'0': 'cpu', '1': 'cpu'}
    """
    check_device_map(model, device_map)
    devices = set(device_map.values())
    # A map onto "disk" alone is hooked too (Accelerate does): the weights stream from the offload folder.
    if len(devices) > 1 or "disk" in devices or force_hooks:
        if main_device is None:
            accelerators = [d for d in device_map.values() if d not in ("cpu", "disk")]
            main_device = accelerators[0] if accelerators else "cpu"
        cpu_modules = [name for name, device in device_map.items() if device == "cpu"]
        if str(main_device) != "cpu" and state_dict is None and cpu_modules:
            state_dict = extract_submodules_state_dict(model.state_dict(), cpu_modules)
        disk_modules = [name for name, device in device_map.items() if device == "disk"]
        if disk_modules and offload_dir is None and offload_index is None:
            raise ValueError(f"Modules {disk_modules} are mapped to 'disk' but there is neither an `offload_dir` "
                             "nor an `offload_index` to read their weights from; pass one of them.")
        folder = cast("str | os.PathLike[str]", offload_dir)  # given whenever disk modules have no offload_index
        if disk_modules and offload_index is None and not os.path.isfile(os.path.join(folder, "index.json")):
            offload_state_dict(folder, extract_submodules_state_dict(model.state_dict(), disk_modules))

        execution_device = {name: main_device if device in ("cpu", "disk") else device for name, device in device_map.items()}
        execution_device[""] = main_device
        # CPU (and MPS's shared memory) hold "cpu" weights in place; only an accelerator offloads them.
        offloaded = ("disk",) if str(main_device) in ("cpu", "mps") else ("cpu", "disk")
        offload = {name: device in offloaded for name, device in device_map.items()}
        save_folder = os.fspath(folder) if disk_modules else None
        if state_dict is not None or save_folder is not None or offload_index is not None:
            weights_map = OffloadedWeightsLoader(state_dict=state_dict, save_folder=save_folder, index=offload_index,
                                                 device=main_device if offload_index is not None else None)
        else:
            weights_map = None

        # Tied weights share one copy per execution device, keyed by the original tensor's pointer.
        # Meta tensors are left out: they all have pointer 0 and would look tied to each other.
        tied_params = find_tied_parameters(model)
        tied_params_map: dict[int, dict] = {}
        for group in tied_params:
            for name in group:
                tensor = recursive_getattr(model, name)
                if not tensor.is_meta:
                    tied_params_map[tensor.data_ptr()] = {}
        attach_align_device_hook_on_blocks(model, execution_device=execution_device, offload=offload,
                                           offload_buffers=offload_buffers, weights_map=weights_map,
                                           skip_keys=skip_keys, preload_module_classes=preload_module_classes,
                                           tied_params_map=tied_params_map)
        offloaded_to = sorted(d for d in devices if d in ("cpu", "disk") and d in offloaded)
        if offloaded_to:
            logger.warning(f"Some parameters are on the meta device: they are offloaded to {' and '.join(offloaded_to)}.")
        retie_parameters(model, tied_params)  # replacing tensors by hooks may have untied them
        _guard_moves(model)
    else:
        model.to(next(iter(devices)))
    setattr(model, "hf_device_map", dict(device_map))  # a plain attribute (nn.Module types its own as tensors)
    return model


def load_checkpoint_and_dispatch(model: nn.Module, checkpoint: str | os.PathLike[str],
                                 device_map: str | dict[str, int | str | torch.device] | None = None,
                                 max_memory: dict[int | str, int | str] | None = None,
                                 no_split_module_classes: list[str] | None = None,
                                 offload_folder: str | os.PathLike[str] | None = None, offload_buffers: bool = False,
                                 dtype: str | torch.dtype | None = None, offload_state_dict: bool | None = None,
                                 skip_keys: str | list[str] | None = None, preload_module_classes: list[str] | None = None,
                                 force_hooks: bool = False, strict: bool = False, full_state_dict: bool = True,
                                 broadcast_from_rank0: bool = False) -> nn.Module:
    """Load a checkpoint (file, sharded index or folder) into a (usually empty) model and dispatch it.

    `device_map` is a dict or one of "auto", "balanced", "balanced_low_0",
    "sequential": the strings infer one from `max_memory` ("auto"/"balanced"
    first balance the memory over several GPUs). Weights are loaded one tensor
    at a time; those mapped to "disk" go to `offload_folder`. The CPU ones go
    straight to their place unless `offload_state_dict` is True (where
    Accelerate's default, None, parks them on disk when some modules go
    there: with one tensor in memory at a time nothing needs parking).
    `full_state_dict` and `broadcast_from_rank0` (rank 0 alone reads the
    files and broadcasts them) are as in `load_checkpoint_in_model`.

    Example:
        >>> torch.save(nn.Linear(4, 2).state_dict(), "model.bin")
        >>> with init_empty_weights():
        ...     model = nn.Linear(4, 2)
        >>> model = load_checkpoint_and_dispatch(model, "model.bin", device_map="auto",
        ...                                      max_memory={"cpu": "2GB"}, offload_folder="offload")
        >>> model.weight.device
        device(type='cpu')
    """
    if isinstance(device_map, str):
        budgets: Any = max_memory
        if device_map not in _DEVICE_MAP_STRINGS:
            raise ValueError(f"device_map={device_map!r} is not valid; as a string it must be one of "
                             f"{', '.join(repr(s) for s in _DEVICE_MAP_STRINGS)} (or pass a dict).")
        if device_map != "sequential":
            budgets = get_balanced_memory(model, max_memory=max_memory, no_split_module_classes=no_split_module_classes,
                                          dtype=dtype, low_zero=device_map == "balanced_low_0")
        device_map = cast(dict[str, int | str | torch.device], infer_auto_device_map(
            model, max_memory=budgets, no_split_module_classes=no_split_module_classes, dtype=dtype,
            offload_buffers=offload_buffers))
    # Accelerate parks the CPU weights on disk by default when some go there, so that a whole shard in memory beside
    # them fits; hasten reads one tensor at a time, so parking would only write and read 1x the CPU weights again
    # (it was 60% of a disk-offloading load). offload_state_dict=True still parks them.
    load_checkpoint_in_model(model, checkpoint, device_map=device_map, offload_folder=offload_folder, dtype=dtype,
                             offload_state_dict=bool(offload_state_dict), offload_buffers=offload_buffers, strict=strict,
                             full_state_dict=full_state_dict, broadcast_from_rank0=broadcast_from_rank0)
    if device_map is None:
        return model
    return dispatch_model(model, device_map=device_map, offload_dir=offload_folder, offload_buffers=offload_buffers,
                          skip_keys=skip_keys, preload_module_classes=preload_module_classes, force_hooks=force_hooks)
