"""The rest of ``accelerate.utils.modeling``: weights of hook-offloaded modules, device and storage identity,
one-file state dicts, model facts, and the autocast / grad-scaler helpers.

Helpers the device-map planner already has (`fallback_allocate`,
`get_module_size_with_ties`, `get_module_leaves`) live in `device_map.py`
and `get_non_persistent_buffers` in `sizes.py`; they are re-exported here.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from ..logging import get_logger
from .device_map import fallback_allocate, get_module_leaves, get_module_size_with_ties
from .hooks import AlignDevicesHook, SequentialHook, _is_mapped
from .loading import _read_tensors
from .sizes import (
    _device_in_map,
    compute_module_sizes,
    get_max_layer_size,
    get_non_persistent_buffers,
    set_module_tensor_to_device,
)

__all__ = [
    "align_module_device",
    "clean_state_dict_for_safetensors",
    "calculate_maximum_sizes",
    "check_device_same",
    "check_tied_parameters_in_config",
    "fallback_allocate",
    "get_grad_scaler",
    "get_mixed_precision_context_manager",
    "get_module_leaves",
    "get_module_size_with_ties",
    "get_non_persistent_buffers",
    "get_state_dict_from_offload",
    "get_state_dict_offloaded_model",
    "has_offloaded_params",
    "id_tensor_storage",
    "is_peft_model",
    "load_state_dict",
    "refuse_recurrent_layers",
]

logger = get_logger(__name__)


def _as_device(device: int | str | torch.device) -> torch.device:
    return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)


def check_device_same(first_device: int | str | torch.device, second_device: int | str | torch.device) -> bool:
    """Whether two devices are the same one: ``"cuda"`` means the current CUDA device (index 0 without CUDA).

    Plain ``==`` says ``torch.device("cuda") != torch.device("cuda:0")``; the
    CPU and ``meta`` are one device whatever their index.

    Example:
        >>> check_device_same(torch.device("cpu"), "cpu:0"), check_device_same("cuda", 0), check_device_same("cuda:1", "cpu")
        (True, True, False)
    """
    first, second = _as_device(first_device), _as_device(second_device)
    if first.type != second.type:
        return False
    if first.type in ("cpu", "meta"):
        return True

    def index(device: torch.device) -> int:
        if device.index is not None:
            return device.index
        return torch.cuda.current_device() if device.type == "cuda" and torch.cuda.is_available() else 0

    return index(first) == index(second)


def id_tensor_storage(tensor: torch.Tensor) -> tuple[torch.device, int, int]:
    """``(device, data pointer, bytes)`` of the storage under `tensor`: equal for views of one storage.

    Unique while the storage lives (a later one may reuse the address);
    every ``meta`` tensor has pointer 0, so they all look alike.

    Example:
        >>> base = torch.zeros(4)
        >>> id_tensor_storage(base[:2]) == id_tensor_storage(base[2:]), id_tensor_storage(base)[2]
        (True, 16)
    """
    storage = tensor.untyped_storage()
    return tensor.device, storage.data_ptr(), storage.nbytes()


def clean_state_dict_for_safetensors(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Drop every later name of a tensor whose storage an earlier name shares, then make tensors contiguous.

    safetensors refuses aliased tensors (tied weights); the first name is kept,
    as transformers' and safetensors' loaders expect. The duplicates are deleted
    from `state_dict` itself; the returned dict holds contiguous tensors.

    Example:
        >>> shared = torch.ones(2)
        >>> sorted(clean_state_dict_for_safetensors({"a": shared, "b": shared, "c": torch.zeros(1)}))
        ['a', 'c']
    """
    names_by_storage: dict[tuple[torch.device, int, int], list[str]] = {}
    for name, tensor in state_dict.items():
        if not isinstance(tensor, str):  # bitsandbytes keeps strings among its weights
            names_by_storage.setdefault(id_tensor_storage(tensor), []).append(name)
    dropped = [name for names in names_by_storage.values() for name in names[1:]]
    for name in dropped:
        del state_dict[name]
    if dropped:
        logger.warning(f"Removed shared tensor {set(dropped)} while saving: tied weights are stored once (check that "
                       "reloading warns of no missing weights).")
    return {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in state_dict.items()}


def is_peft_model(model: nn.Module) -> bool:
    """Whether `model` (inside DDP / FSDP / compile wrappers) is a ``peft.PeftModel``.

    Example:
        >>> is_peft_model(nn.Linear(2, 2))
        False
    """
    peft = sys.modules.get("peft")  # no object can be a PeftModel unless peft was imported: never import it here
    if peft is None:
        return False
    from ..runtime.unwrap import extract_model_from_parallel

    return isinstance(extract_model_from_parallel(model), peft.PeftModel)


def check_tied_parameters_in_config(model: nn.Module) -> bool:
    """Whether a ``transformers`` model's config says some weights are tied (word embeddings, encoder-decoder, modules).

    `infer_auto_device_map`'s planning needs those ties made (``model.tie_weights()``)
    before it runs; any other model says False.

    Example:
        >>> check_tied_parameters_in_config(nn.Linear(2, 2))
        False
    """
    if "PreTrainedModel" not in {cls.__name__ for cls in inspect.getmro(type(model))}:
        return False
    pretrained: Any = model  # a transformers PreTrainedModel (checked above): config and embeddings accessors
    config: Any = getattr(pretrained, "config", None)
    text_config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    tied_embeddings = bool(getattr(text_config, "tie_word_embeddings", False)) and pretrained.get_output_embeddings() is not None
    tied_encoder_decoder = bool(getattr(config, "is_encoder_decoder", False) and getattr(config, "tie_encoder_decoder", False))
    return tied_embeddings or tied_encoder_decoder or any(hasattr(module, "_tie_weights") for module in model.modules())


def calculate_maximum_sizes(model: nn.Module) -> tuple[int, tuple[int, list[str]]]:
    """Bytes of `model`, and the size and names of its largest block that cannot be cut further.

    Blocks of a class in ``model._no_split_modules`` (``transformers`` sets it) are not cut.

    Example:
        >>> calculate_maximum_sizes(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)))
        (120, (80, ['0']))
    """
    sizes = compute_module_sizes(model)
    top: list[tuple[str, nn.Module | torch.Tensor]] = [
        *model.named_parameters(recurse=False), *model.named_children(), *model.named_buffers(recurse=False)]
    return sizes[""], get_max_layer_size(top, sizes, list(getattr(model, "_no_split_modules", None) or []))


def _offload_hook(module: nn.Module) -> AlignDevicesHook | None:
    """The `AlignDevicesHook` with offload of `module`, also when it sits in a `SequentialHook` with others."""
    pending = [getattr(module, "_hf_hook", None)]
    while pending:
        hook = pending.pop(0)
        if isinstance(hook, AlignDevicesHook) and hook.offload:
            return hook
        if isinstance(hook, SequentialHook):
            pending[:0] = list(hook.hooks)
    return None


def has_offloaded_params(module: nn.Module) -> bool:
    """Whether `module` has a hook keeping its weights off-device between forwards (cpu or disk offload).

    Example:
        >>> from hasten.big_modeling import cpu_offload
        >>> net = cpu_offload(nn.Sequential(nn.Linear(2, 2)), execution_device="cpu")
        >>> has_offloaded_params(net[0]), has_offloaded_params(nn.Linear(2, 2))
        (True, False)
    """
    return _offload_hook(module) is not None


@contextlib.contextmanager
def align_module_device(module: nn.Module, execution_device: int | str | torch.device | None = None) -> Iterator[None]:
    """Inside the block, `module`'s own weights are on `execution_device`; on exit they go back where they were.

    A module whose weights a hook offloads gets them brought in as for a
    forward (on `execution_device` if given, else the hook's device) and
    offloaded again on exit; writes to them last only where the offloaded
    copy is in memory (cpu offload), not for weights read from disk. Any
    other module has its own parameters moved, and moved back with their
    values on exit; without `execution_device` nothing moves.

    Example:
        >>> import tempfile
        >>> from hasten.big_modeling import disk_offload
        >>> net = disk_offload(nn.Sequential(nn.Linear(2, 2)), tempfile.mkdtemp(), execution_device="cpu")
        >>> with align_module_device(net[0]):
        ...     net[0].weight.device
        device(type='cpu')
        >>> net[0].weight.device
        device(type='meta')
    """
    hook = _offload_hook(module)
    if hook is not None:
        original = hook.execution_device
        if execution_device is not None:
            hook.execution_device = execution_device
        try:
            hook.pre_forward(module)
            _private_copies(module, hook)
            yield
        finally:
            hook.post_forward(module, None)
            hook.execution_device = original
        return
    if execution_device is None:
        yield
        return
    devices = {name: param.device for name, param in module.named_parameters(recurse=False)}
    try:
        for name in devices:
            set_module_tensor_to_device(module, name, execution_device, clear_cache=False)
        yield
    finally:
        for name, device in devices.items():
            set_module_tensor_to_device(module, name, device, clear_cache=False)


def _private_copies(module: nn.Module, hook: AlignDevicesHook) -> None:
    """Give `module` writable copies of parameters that are read-only disk mappings (on CPU, forward uses them as is).

    Code inside `align_module_device` may write to the weights; a write to a
    read-only mapping would crash the process instead of raising.
    """
    for name, param in module.named_parameters(recurse=hook.place_submodules):
        if param.device.type == "cpu" and hook.weights_map is not None and _is_mapped(hook.weights_map, name):
            set_module_tensor_to_device(module, name, "cpu", value=param.detach().clone())


def get_state_dict_offloaded_model(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of `model` on the CPU, with hook-offloaded weights brought in one module at a time.

    Equal to ``model.state_dict()`` of the model before it was offloaded;
    only one module's offloaded weights are loaded at once, and tensors on
    an accelerator are copied to the CPU. Tensors still on ``meta`` (never
    loaded) are left out, with a warning naming them.

    Example:
        >>> import tempfile
        >>> from hasten.big_modeling import disk_offload
        >>> net = nn.Sequential(nn.Linear(2, 2)); expected = {k: v.clone() for k, v in net.state_dict().items()}
        >>> net = disk_offload(net, tempfile.mkdtemp(), execution_device="cpu")
        >>> state = get_state_dict_offloaded_model(net)
        >>> sorted(state), all(torch.equal(state[k], expected[k]) for k in expected)
        (['0.bias', '0.weight'], True)
    """
    state: dict[str, torch.Tensor] = {}
    placeholders: list[str] = []
    pending: list[tuple[str, nn.Module]] = [("", model)]
    while pending:
        prefix, module = pending.pop(0)
        hook = _offload_hook(module)
        whole = hook is not None and hook.place_submodules  # one hook loads this module with all its children
        own: dict[str, Any] = {}
        with align_module_device(module, "cpu" if hook is not None else None):
            if whole:
                module.state_dict(destination=own, prefix=prefix)
            else:
                module._save_to_state_dict(own, prefix, keep_vars=False)  # this module's tensors only, as state_dict does
            for key, tensor in own.items():
                if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                    placeholders.append(key)
                else:
                    state[key] = tensor.to("cpu") if isinstance(tensor, torch.Tensor) else tensor
        if not whole:
            # _modules, not named_children: a submodule shared under two names is in the state dict twice
            pending[:0] = [(f"{prefix}{name}.", child) for name, child in module._modules.items() if child is not None]
    missing = [key for key in placeholders if key not in state]
    if missing:
        logger.warning(f"{len(missing)} tensor(s) are still on the meta device (never loaded), so the state dict "
                       f"leaves them out: {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}")
    return state


def get_state_dict_from_offload(module: nn.Module, module_name: str, state_dict: dict[str, Any],
                                device_to_put_offload: int | str | torch.device = "cpu") -> dict[str, Any]:
    """Fill the entries of `state_dict` that belong to `module` (the owner of tensor `module_name`) with its tensors.

    `module_name` is a tensor name such as ``"h.0.attn.weight"``: `module`'s
    state dict keys are looked up under ``"h.0.attn."``. Offloaded weights are
    brought in on `device_to_put_offload` just for this; a module without
    offload gives its tensors where they are. Returns `state_dict`, updated.

    Example:
        >>> from hasten.big_modeling import cpu_offload
        >>> net = cpu_offload(nn.Sequential(nn.Linear(2, 2)), execution_device="cpu")
        >>> state = get_state_dict_from_offload(net[0], "0.weight", {"0.weight": None, "0.bias": None})
        >>> [tuple(t.shape) for t in state.values()]
        [(2, 2), (2,)]
    """
    root = module_name.rpartition(".")[0]
    prefix = f"{root}." if root else ""
    device = device_to_put_offload if has_offloaded_params(module) else None
    with align_module_device(module, device):
        for key, tensor in module.state_dict().items():
            if prefix + key in state_dict:
                state_dict[prefix + key] = tensor
    return state_dict


def _map_device(name: str, device_map: Mapping[str, Any]) -> torch.device:
    try:
        device = _device_in_map(name, device_map)
    except ValueError:
        device = "cpu"  # not in the map: the CPU, as the peer does
    return torch.device("cpu") if device == "disk" else _as_device(device)  # disk weights are read into memory first


def load_state_dict(checkpoint_file: str | os.PathLike[str], device_map: Mapping[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """The tensors of one weights file (safetensors, or a torch file loaded with ``weights_only``), by name.

    Tensors are read one at a time (safetensors entry by entry, torch files
    memory-mapped) and, with `device_map`, each is sent to the device of its
    module right away ("disk" and unmapped names stay on the CPU). A
    safetensors file saved from another framework (format "tf"/"flax") is
    refused: its layouts are not PyTorch's.

    Example:
        >>> import tempfile
        >>> from safetensors.torch import save_file
        >>> path = f"{tempfile.mkdtemp()}/model.safetensors"; save_file({"w": torch.ones(2)}, path)
        >>> load_state_dict(path, device_map={"": "cpu"})
        {'w': tensor([1., 1.])}
    """
    path = Path(checkpoint_file)
    if not path.is_file():
        raise FileNotFoundError(f"no weights file at {path}; give the path of a .safetensors or torch weights file.")
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as file:
            fmt = (file.metadata() or {}).get("format", "pt")  # no metadata: written by plain safetensors, PyTorch's
        if fmt != "pt":
            raise ValueError(f"{path} was saved with format {fmt!r}, not 'pt'; convert it to a PyTorch checkpoint first.")
    tensors: dict[str, torch.Tensor] = {}
    for name, item in _read_tensors(path):
        tensor = cast(torch.Tensor, item)  # no `raw` names: every item is a tensor
        if device_map is not None:
            device = _map_device(name, device_map)
            tensor = tensor if device.type == "cpu" else tensor.to(device)
        tensors[name] = tensor
    return tensors


def get_mixed_precision_context_manager(native_amp: bool = False, autocast_kwargs: Any = None) -> contextlib.AbstractContextManager[Any]:
    """The autocast block of the current run's mixed precision, or a no-op one when `native_amp` is False.

    The precision and device come from `AcceleratorState` (the newest
    Accelerator's choice); `autocast_kwargs` (an `AutocastKwargs` or a dict
    of ``enabled``/``cache_enabled``) tunes it. Under
    ``mixed_precision="no"`` there is nothing to cast to, so no autocast.

    Example:
        >>> with get_mixed_precision_context_manager(native_amp=False):
        ...     torch.ones(1).dtype
        torch.float32
    """
    if not native_amp:
        return contextlib.nullcontext()
    from ..runtime.precision import make_precision_policy
    from ..runtime.accelerator_state import AcceleratorState

    state = AcceleratorState()
    options = autocast_kwargs.to_kwargs() if hasattr(autocast_kwargs, "to_kwargs") else dict(autocast_kwargs or {})
    return make_precision_policy(state.mixed_precision, state.device).autocast(**options)


def get_grad_scaler(distributed_type: Any = None, **kwargs: Any) -> torch.amp.GradScaler:
    """A loss scaler for fp16 on this process's device (CUDA, else MPS, else CPU); FSDP's sharded one under FSDP.

    `kwargs` go to the scaler (``init_scale``, ``growth_interval``, ...,
    ``device`` to pick another device type).

    Example:
        >>> get_grad_scaler(init_scale=1024.0).get_scale()
        1024.0
    """
    from ..process.topology import select_device

    kwargs.setdefault("device", select_device(int(os.environ.get("LOCAL_RANK", "0") or 0)).type)
    if distributed_type == "FSDP":  # DistributedType is a str enum
        # inf/NaN must be agreed on by all shards, or ranks would skip different steps
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(**kwargs)
    return torch.amp.GradScaler(**kwargs)


def refuse_recurrent_layers(model: Any) -> None:
    """Refuse, in one sentence, a model with linear-attention layers about to be cut along the sequence.

    Sequence parallelism (DeepSpeed's Ulysses) gathers the whole sequence around each attention call, which
    leaves ordinary attention exact; a linear-attention (recurrent) layer computes its state in its own code,
    so every process would restart it from zero: wrong gradients that a loss curve does not show. Read from
    the model's (text) config's ``layer_types``; a model without them passes.

    Example:
        >>> from types import SimpleNamespace
        >>> refuse_recurrent_layers(SimpleNamespace(config=SimpleNamespace(layer_types=["full_attention"])))
        >>> refuse_recurrent_layers(SimpleNamespace(config=SimpleNamespace(layer_types=["linear_attention"])))
        Traceback (most recent call last):
        ...
        ValueError: sequence parallelism cannot shard SimpleNamespace's ['linear_attention'] layers, whose recurrent state along the sequence would restart on every process; use a full-attention model, or, if those layers exchange that state across the sequence-parallel processes themselves, set DeepSpeedSequenceParallelConfig(sp_allow_recurrent_layers=True).
    """
    config: Any = getattr(model, "config", None)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    recurrent = sorted({kind for kind in (getattr(config, "layer_types", None) or []) if "linear_attention" in kind})
    if recurrent:
        raise ValueError(f"sequence parallelism cannot shard {type(model).__name__}'s {recurrent} layers, whose "
                         "recurrent state along the sequence would restart on every process; use a full-attention "
                         "model, or, if those layers exchange that state across the sequence-parallel processes "
                         "themselves, set DeepSpeedSequenceParallelConfig(sp_allow_recurrent_layers=True).")


# Accelerate's (private) name, which its tests import from ``accelerate.big_modeling``.
_refuse_recurrent_layers_under_sequence_parallelism = refuse_recurrent_layers
