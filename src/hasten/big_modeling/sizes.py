"""How many bytes things take: memory strings, tensors, modules, devices; tied parameters; placing one tensor.

Everything here works on ``meta`` tensors too, so a model built without
memory can be measured and planned before a single weight is read.
"""

from __future__ import annotations

import logging
import math
import numbers
import os
import re
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

import torch
from torch import nn

from .bnb_params import is_quantized_param, place_quantized

__all__ = [
    "check_tied_parameters_on_same_device",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "dtype_byte_size",
    "find_tied_parameters",
    "get_max_layer_size",
    "get_max_memory",
    "get_non_persistent_buffers",
    "named_module_tensors",
    "retie_parameters",
    "set_module_tensor_to_device",
]

_log = logging.getLogger(__name__)
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]I?B|B)?\s*", re.IGNORECASE)
# dtypes that placement never casts (casting them would change values, not just precision)
_NEVER_CAST = ("torch.uint", "torch.int", "torch.bool")
_ESTIMATE_DTYPES = {"int8": 1, "fp8": 1, "int4": 0.5, "int2": 0.25}


def _parse_size(size: int | str, label: str) -> int:
    """One parser for every size string in hasten; `label` names the argument in the error."""
    if isinstance(size, numbers.Real) and not isinstance(size, bool) and size >= 0:
        return round(size)  # floats come from budgets scaled by a fraction
    match = _SIZE.fullmatch(size) if isinstance(size, str) else None
    if match is None:
        raise ValueError(
            f"{label}={size!r} is not a size; write a byte count or a number with a unit, like 60MB, 2GiB, 500kb, "
            "1.5GB or 1048576 (KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB powers of 1024)."
        )
    # round, not truncate: 2.3MB is 2300000 bytes although 2.3 * 10**6 is 2299999.99...
    return round(float(match.group(1)) * _UNITS[(match.group(2) or "").upper()])


def convert_file_size_to_int(size: int | str) -> int:
    """Bytes in `size`: an int, or a string such as ``"60MB"``, ``"2GiB"``, ``"500kb"``, ``"1.5GB"`` (any case).

    Example:
        >>> convert_file_size_to_int("1.5GB"), convert_file_size_to_int("2KiB"), convert_file_size_to_int(7)
        (1500000000, 2048, 7)
    """
    return _parse_size(size, "size")


def dtype_byte_size(dtype: torch.dtype | str) -> float:
    """Bytes per element of `dtype` (``torch.bool`` is 1/8; the estimate strings "int8"/"int4"/"int2"/"fp8" work too).

    Example:
        >>> dtype_byte_size(torch.float16), dtype_byte_size(torch.bool), dtype_byte_size("int4")
        (2, 0.125, 0.5)
    """
    dtype = getattr(dtype, "value", dtype)  # Accelerate's CustomDtype members ("int4", ...)
    if isinstance(dtype, str):
        if dtype in _ESTIMATE_DTYPES:
            return _ESTIMATE_DTYPES[dtype]
        dtype = cast("torch.dtype | str", _to_dtype(dtype))  # a str other than the estimate names becomes a dtype
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype={dtype!r} is not a torch dtype or one of {sorted(_ESTIMATE_DTYPES)}.")
    if dtype == torch.bool:
        return 1 / 8
    return dtype.itemsize


def _to_dtype(dtype: torch.dtype | str | None) -> torch.dtype | str | None:
    """``"float16"`` / ``"torch.float16"`` -> ``torch.float16``; estimate strings and dtypes pass through."""
    if not isinstance(dtype, str) or dtype in _ESTIMATE_DTYPES:
        return dtype
    value = getattr(torch, dtype.replace("torch.", ""), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"dtype={dtype!r} is not a torch dtype (write it like 'float16' or 'torch.bfloat16').")
    return value


def named_module_tensors(module: nn.Module, include_buffers: bool = True, recurse: bool = False,
                         remove_non_persistent: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for the parameters of `module`, then its buffers (optionally only persistent ones).

    Example:
        >>> [name for name, _ in named_module_tensors(nn.BatchNorm1d(2))]
        ['weight', 'bias', 'running_mean', 'running_var', 'num_batches_tracked']
    """
    yield from module.named_parameters(recurse=recurse)
    if not include_buffers:
        return
    skipped = get_non_persistent_buffers(module, recurse=recurse, fqns=True) if remove_non_persistent else set()
    for name, buffer in module.named_buffers(recurse=recurse):
        if name not in skipped:
            yield name, buffer


def get_non_persistent_buffers(module: nn.Module, recurse: bool = False, fqns: bool = False) -> set[str]:
    """Names of the buffers of `module` registered with ``persistent=False`` (left out of its state dict).

    With `recurse`, submodules' too: as dotted names from `module` with
    `fqns`, else as their bare names (which may then collide).

    Example:
        >>> net = nn.Sequential(nn.Module()); net[0].register_buffer("cache", torch.zeros(1), persistent=False)
        >>> get_non_persistent_buffers(net), get_non_persistent_buffers(net, recurse=True, fqns=True)
        (set(), {'0.cache'})
    """
    owners = module.named_modules() if recurse else [("", module)]
    return {f"{prefix}.{name}" if prefix and fqns else name for prefix, owner in owners for name in owner._non_persistent_buffers_set}


def _tensor_bytes(tensor: torch.Tensor, dtype: Any, special: Mapping[str, Any], name: str) -> int:
    if name in special:
        per_item = dtype_byte_size(special[name])
    elif dtype is None or str(tensor.dtype).startswith(_NEVER_CAST):
        per_item = dtype_byte_size(tensor.dtype)  # loading never casts these, so they keep their size
    else:
        per_item = min(dtype_byte_size(dtype), dtype_byte_size(tensor.dtype))
    return math.ceil(tensor.numel() * per_item)


def compute_module_sizes(model: nn.Module, dtype: torch.dtype | str | None = None,
                         special_dtypes: Mapping[str, torch.dtype | str] | None = None,
                         buffers_only: bool = False) -> dict[str, int]:
    """Bytes under every name prefix of `model`'s tensors ("" is the whole model; tied weights count once).

    `dtype` is the dtype the weights will be loaded in (floating tensors
    only shrink to it); `special_dtypes` overrides it per tensor name.
    The result is a ``defaultdict(int)``: a module without tensors is 0.

    Example:
        >>> sizes = compute_module_sizes(nn.Sequential(nn.Linear(2, 3), nn.ReLU()))
        >>> sizes[""], sizes["0"], sizes["0.weight"], sizes["1"]
        (36, 36, 24, 0)
    """
    dtype = _to_dtype(dtype)
    special = {key: _to_dtype(value) for key, value in (special_dtypes or {}).items()}
    tensors = model.named_buffers() if buffers_only else named_module_tensors(model, recurse=True)
    sizes: dict[str, int] = defaultdict(int)
    for name, tensor in tensors:
        nbytes = _tensor_bytes(tensor, dtype, special, name)
        parts = name.split(".")
        for end in range(len(parts) + 1):
            sizes[".".join(parts[:end])] += nbytes
    return sizes


def compute_module_total_buffer_size(model: nn.Module, dtype: torch.dtype | str | None = None,
                                     special_dtypes: Mapping[str, torch.dtype | str] | None = None) -> int:
    """Bytes of all buffers of `model`.

    Example:
        >>> compute_module_total_buffer_size(nn.BatchNorm1d(4))  # two float32 vectors of 4 + one int64
        40
    """
    return compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes, buffers_only=True).get("", 0)


def get_max_layer_size(modules: Sequence[tuple[str, nn.Module | torch.Tensor]], module_sizes: Mapping[str, int],
                       no_split_module_classes: list[str]) -> tuple[int, list[str]]:
    """Largest block that cannot be cut further, and the names of all blocks of that size.

    A block is a module without children, a module whose class name is in
    `no_split_module_classes`, or a bare tensor in `modules`.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)))
        >>> get_max_layer_size([("", net)], compute_module_sizes(net), [])
        (80, ['1.0', '1.1'])
        >>> get_max_layer_size(list(net.named_children()), compute_module_sizes(net), ["Sequential"])
        (160, ['1'])
    """
    largest, names = 0, []
    pending: list[tuple[str, Any]] = list(modules)
    while pending:
        name, module = pending.pop(0)
        children = list(module.named_children()) if isinstance(module, nn.Module) else []
        if children and module.__class__.__name__ not in no_split_module_classes:
            prefix = f"{name}." if name else ""
            pending[:0] = [(prefix + child_name, child) for child_name, child in children]
            continue
        size = module_sizes.get(name, 0)
        if size > largest:
            largest, names = size, [name]
        elif size == largest:
            names.append(name)
    return largest, names


def find_tied_parameters(model: nn.Module, **kwargs: Any) -> list[list[str]]:
    """Groups of names that refer to one parameter object (each group sorted); works on ``meta`` models.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)); net[1].weight = net[0].weight
        >>> find_tied_parameters(net)
        [['0.weight', '1.weight']]
    """
    names_by_param: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names_by_param.setdefault(id(param), []).append(name)
    return [sorted(set(names)) for names in names_by_param.values() if len(set(names)) > 1]


def _owner(model: nn.Module, tensor_name: str) -> tuple[nn.Module, str]:
    """The module that holds `tensor_name` directly, and the tensor's own name in it."""
    path, _, leaf = tensor_name.rpartition(".")
    module = model
    for part in path.split(".") if path else ():
        child = getattr(module, part, None)
        if not isinstance(child, nn.Module):
            raise ValueError(f"{tensor_name!r} does not name a tensor of {type(model).__name__}: it has no submodule {part!r}.")
        module = child
    return module, leaf


def retie_parameters(model: nn.Module, tied_params: list[list[str]]) -> None:
    """Make every name of each group in `tied_params` point to one parameter again (the first not on ``meta``).

    Loading replaces parameters one name at a time, which unties them; this undoes that.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
        >>> retie_parameters(net, [["0.weight", "1.weight"]])
        >>> net[0].weight is net[1].weight
        True
    """
    for group in tied_params:
        owners = [_owner(model, name) for name in group]
        source = next((getattr(m, leaf) for m, leaf in owners if not getattr(m, leaf).is_meta), None)
        if source is None:
            continue  # all on meta: nothing to share yet
        for module, leaf in owners:
            setattr(module, leaf, source)


def _device_in_map(name: str, device_map: Mapping[str, Any]) -> Any:
    """Device of the longest key of `device_map` that is `name` or one of its parent modules ("" matches all)."""
    candidate = name
    while True:
        if candidate in device_map:
            return device_map[candidate]
        if not candidate:
            raise ValueError(f"the device_map gives no device for {name!r} nor any module containing it; add it (or '') to the map.")
        candidate = candidate.rpartition(".")[0]


def check_tied_parameters_on_same_device(tied_params: list[list[str]], device_map: Mapping[str, Any]) -> None:
    """Log a warning when the names of one tied parameter are put on different devices by `device_map`.

    Example:
        >>> check_tied_parameters_on_same_device([["a.weight", "b.weight"]], {"a": 0, "b": 0})
    """
    for group in tied_params:
        devices = {name: _device_in_map(name, device_map) for name in group}
        if len({str(device) for device in devices.values()}) > 1:
            # a log line, as Accelerate's (not a Python warning, which callers may turn into errors)
            _log.warning(f"Tied parameters are on different devices {devices}: they will be stored twice and drift "
                         "apart; put their modules on one device (device_map='auto' does).")


def _available_ram() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _device_key(key: Any) -> int | str:
    """0, "0", "cuda:0" and torch.device("cuda:0") all mean GPU 0; "cpu", "mps" and "disk" stay strings."""
    if isinstance(key, torch.device):
        key = str(key) if key.type != "cuda" else (key.index or 0)
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    text = str(key).strip().lower()
    if text.isdigit():
        return int(text)
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    if text in ("cpu", "mps", "disk"):
        return text
    raise ValueError(f"max_memory has a key {key!r} that is not a device; use GPU indices (0, 1, ...), 'mps', 'cpu' or 'disk'.")


def get_max_memory(max_memory: Mapping[Any, int | str] | None = None) -> dict[int | str, int]:
    """Bytes allowed per device, GPUs first (ascending), then "mps", "cpu", "disk"; strings become ints.

    With None: the free memory of every CUDA device and the available RAM as "cpu".

    Example:
        >>> get_max_memory({"cpu": "1GB", 1: "2GiB", 0: 10})
        {0: 10, 1: 2147483648, 'cpu': 1000000000}
    """
    if max_memory is None:
        found: dict[int | str, int] = {}
        if torch.cuda.is_available():
            for index in range(torch.cuda.device_count()):
                found[index] = int(torch.cuda.mem_get_info(index)[0])
        found["cpu"] = _available_ram()
        return found
    converted: dict[int | str, int] = {}
    for key, value in max_memory.items():
        device = _device_key(key)
        converted[device] = _parse_size(value, f"max_memory[{key!r}]")
    gpus = sorted(k for k in converted if isinstance(k, int))
    present = torch.cuda.device_count() if torch.cuda.is_available() else 0
    missing = [gpu for gpu in gpus if gpu >= present or gpu < 0]
    if missing:
        # planning for GPUs that are not here is legitimate (a map for another machine): a log line, as Accelerate's,
        # not a Python warning (callers count those: infer_auto_device_map's buffer warning)
        _log.warning("max_memory names GPU(s) %s but this machine has %d; the plan is computed anyway.", missing, present)
    return {key: converted[key] for key in [*gpus, *(k for k in ("mps", "cpu", "disk") if k in converted)]}


def set_module_tensor_to_device(module: nn.Module, tensor_name: str, device: int | str | torch.device,
                                value: torch.Tensor | None = None, dtype: torch.dtype | str | None = None,
                                fp16_statistics: torch.Tensor | None = None,
                                tied_params_map: dict[int, dict[Any, torch.Tensor]] | None = None,
                                non_blocking: bool = False, clear_cache: bool = True) -> None:
    """Put the parameter or buffer `tensor_name` ("block.0.weight") of `module` on `device`, optionally with new data.

    `value` replaces the data (its shape must match); it is cast to `dtype`
    when given (integer and bool tensors are never cast), else to the old
    tensor's dtype. A parameter stays a parameter with its ``requires_grad``.
    A tensor on ``meta`` needs a `value` to go anywhere but ``meta``.
    `tied_params_map` (data pointer -> {device: tensor}) lets tied weights
    share the copy already made on `device` instead of making another.
    `non_blocking` makes the copy to `device` asynchronous where torch can
    (pinned CPU memory to CUDA); `clear_cache` empties the accelerator's
    cache afterwards when `device` is an accelerator (hasten's own hooks and
    loaders pass False: emptying it per tensor only slows them down).
    A bitsandbytes parameter (`Int8Params`, `Params4bit`) is quantized as it
    is placed, and already-quantized int8 data keeps its values, with
    `fp16_statistics` (its row scales) as the weight's ``SCB``; see
    `bnb_params.py`.

    Example:
        >>> with torch.device("meta"):
        ...     layer = nn.Linear(2, 2)
        >>> set_module_tensor_to_device(layer, "weight", "cpu", value=torch.ones(2, 2))
        >>> layer.weight.device, layer.weight.requires_grad
        (device(type='cpu'), True)
    """
    owner, leaf = _owner(module, tensor_name)
    is_buffer = leaf in owner._buffers
    if not is_buffer and leaf not in owner._parameters:
        raise ValueError(f"{type(owner).__name__} has no parameter or buffer named {leaf!r} (from {tensor_name!r}).")
    old = getattr(owner, leaf)
    if old is None:
        raise ValueError(f"{tensor_name!r} is None in the model, so there is nothing to place.")
    table = cast(dict[str, Any], owner._buffers if is_buffer else owner._parameters)
    if tied_params_map is not None:
        for source in (value, old):
            # meta tensors all have pointer 0, so they never identify a tied weight
            shared = tied_params_map.get(source.data_ptr(), {}) if source is not None and not source.is_meta else {}
            if device in shared:  # a tied twin is already on `device`: share it instead of a second copy
                table[leaf] = shared[device]
                return
    target = torch.device(f"cuda:{device}") if isinstance(device, int) else torch.device(device)
    dtype = _to_dtype(dtype)
    if value is None and old.is_meta and target.type != "meta":
        raise ValueError(f"{tensor_name!r} is on the meta device, so it has no data to put on {device}; pass `value`.")
    quantized = not is_buffer and is_quantized_param(old)
    with torch.no_grad():
        if value is not None:
            value = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
            if value.shape != old.shape and type(old).__name__ != "Params4bit":  # 4-bit data is packed
                # Accelerate's exact sentence: libraries and tests compare it whole
                raise ValueError(f'Trying to set a tensor of shape {value.shape} in "{leaf}" (which has shape {old.shape}), '
                                 "this looks incorrect.")
            if dtype is None and not (quantized and str(value.dtype).startswith(_NEVER_CAST)):
                value = value.to(old.dtype)  # what load_state_dict does: the model's dtype wins (not quantized data)
            elif dtype is not None and not str(value.dtype).startswith(_NEVER_CAST):
                value = value.to(dtype)
            new = value if quantized else value.to(target, non_blocking=non_blocking)
        elif quantized:  # moved by its own class below (the data it holds may be quantized already)
            cast_on_meta = dtype is not None and target.type == "meta" and old.is_floating_point()
            new = old.data.to(dtype) if cast_on_meta else old.data
        else:
            new = old.to(target, non_blocking=non_blocking)
            if dtype is not None and target.type == "meta" and not str(old.dtype).startswith(_NEVER_CAST):
                new = new.to(dtype)
        if is_buffer:
            owner._buffers[leaf] = new
        elif quantized:
            if value is not None or old.device != target or new.dtype != old.dtype:  # bitsandbytes quantizes on the way
                owner._parameters[leaf] = place_quantized(old, new, target, fp16_statistics)
            elif fp16_statistics is not None:
                old.SCB = fp16_statistics.to(target)
        elif new is not old:
            grad = old.requires_grad and (new.is_floating_point() or new.is_complex())
            try:
                owner._parameters[leaf] = cast(nn.Parameter, type(old)(new, requires_grad=grad))
            except TypeError:  # a Parameter subclass with another constructor
                owner._parameters[leaf] = nn.Parameter(new, requires_grad=grad)
        if fp16_statistics is not None and not quantized and not is_buffer:  # as Accelerate: the 8-bit scales ride along
            owner._parameters[leaf].SCB = fp16_statistics.to(target)  # type: ignore[union-attr]
    if tied_params_map is not None:
        for source in (old, value):
            if source is not None and not source.is_meta and source.data_ptr() in tied_params_map:
                tied_params_map[source.data_ptr()].setdefault(device, cast(torch.Tensor, table[leaf]))
                break
    if clear_cache and target.type not in ("cpu", "meta"):
        from ..runtime.memory import clear_device_cache

        clear_device_cache()
