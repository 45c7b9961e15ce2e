"""Device maps: which device each module of a model lives on, planned from module sizes and per-device budgets.

A device map is an ordered ``{module name: device}``; a module not named
takes the device of its closest named parent ("" names the whole model).
Devices are GPU indices (ints), "mps", "cpu" and "disk".
"""

from __future__ import annotations

import logging
import numbers
import warnings
from collections import OrderedDict
from collections.abc import Mapping, MutableMapping
from typing import Any, cast

import torch
from torch import nn

from .sizes import (
    _parse_size,
    compute_module_sizes,
    compute_module_total_buffer_size,
    find_tied_parameters,
    get_max_layer_size,
    get_max_memory,
)

__all__ = ["check_device_map", "clean_device_map", "fallback_allocate", "get_balanced_memory", "get_module_leaves",
           "get_module_size_with_ties", "infer_auto_device_map"]

_log = logging.getLogger(__name__)
Entry = tuple[str, Any]  # (name, module or bare tensor) waiting for a device


def _as_list(classes: Any) -> list[str]:
    if classes is None:
        return []
    return [classes] if isinstance(classes, str) else list(classes)


def _inside(name: str, module: str) -> bool:
    return name == module or name.startswith(module + ".")


def _under(name: str, key: str) -> bool:
    # Accelerate's test, kept so the maps are its maps: `name` followed by a dot anywhere in `key` (so "1" also
    # matches "11.weight" and "a.1.weight"); the planner and the fallback search share it
    return name + "." in key + "."


def _children(module: Any) -> list[tuple[str, Any]]:
    return list(module.named_children()) if isinstance(module, nn.Module) else []


def _splittable(module: Any, no_split: list[str]) -> bool:
    return bool(_children(module)) and module.__class__.__name__ not in no_split


def _parts(name: str, module: nn.Module) -> list[Entry]:
    """What a module is cut into: its own parameters, then its children (its own buffers get no entry, as in Accelerate's maps)."""
    return [(f"{name}.{n}", v) for n, v in [*module.named_parameters(recurse=False), *module.named_children()]]


def _tied_outside(name: str, tied: list[list[str]]) -> list[str]:
    """Names tied to a parameter inside `name` that live outside it (they must go where `name` goes)."""
    outside: list[str] = []
    for group in tied:
        inner = [_under(name, member) for member in group]
        if any(inner) and not all(inner):
            outside.extend(member for member, is_in in zip(group, inner) if not is_in)
    return outside


def _layers_of(queue: list[Entry]) -> list[Entry]:
    return [(n, m) for n, m in queue if isinstance(m, nn.Module)]


def get_module_size_with_ties(tied_params: list[str], module_size: int, module_sizes: Mapping[str, int],
                              modules_to_treat: list[Entry]) -> tuple[int, list[str], list[Any]]:
    """Bytes a module needs with the waiting modules holding its tied twins, and those modules' names and objects.

    `tied_params` names the twins outside the module; `modules_to_treat` is
    the queue of ``(name, module)`` still waiting for a device. Each twin
    adds its holder's size less its own (the twin is the module's weight,
    already counted), and names its holder once per twin, as Accelerate
    does. A twin whose holder is no longer waiting adds nothing.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)); net[1].weight = net[0].weight
        >>> sizes = compute_module_sizes(net)
        >>> get_module_size_with_ties(["1.weight"], sizes["0"], sizes, list(net.named_children())[1:])[:2]
        (32, ['1'])
    """
    needed, names, modules = module_size, [], []
    for twin in tied_params:
        holder = next(((n, m) for n, m in modules_to_treat if twin.startswith(n + ".")), None)
        if holder is None:
            continue
        names.append(holder[0])
        modules.append(holder[1])
        needed += module_sizes.get(holder[0], 0) - module_sizes.get(twin, 0)
    return needed, names, modules


def fallback_allocate(modules: list[Entry], module_sizes: Mapping[str, int], size_limit: int | str,
                      no_split_module_classes: list[str] | None = None,
                      tied_parameters: list[list[str]] | None = None) -> tuple[str | None, Any, list[Entry]]:
    """First block (breadth-first, cutting modules open as needed) of `modules` that fits in `size_limit` with its ties.

    Returns its name, the block, and `modules` with every ancestor of it cut
    into its parts and the block taken out; ``(None, None, modules)`` when
    nothing fits (a negative limit fits nothing). `infer_auto_device_map(fallback_allocation=True)`
    uses it to put something on a device that would otherwise stay empty.

    Example:
        >>> net = nn.Sequential(nn.Linear(100, 100), nn.Linear(2, 2))
        >>> name, block, rest = fallback_allocate(list(net.named_children()), compute_module_sizes(net), "1KB")
        >>> name, [n for n, _ in rest]
        ('1', ['0'])
    """
    if isinstance(size_limit, numbers.Real) and size_limit < 0:
        return None, None, modules
    limit = _parse_size(size_limit, "size_limit")
    no_split = _as_list(no_split_module_classes)
    tied = list(tied_parameters or [])
    search = list(modules)
    found: Entry | None = None
    while search:
        name, module = search.pop(0)
        needed, _, _ = get_module_size_with_ties(_tied_outside(name, tied), module_sizes.get(name, 0), module_sizes, search)
        if needed <= limit:
            found = (name, module)
            break
        if _splittable(module, no_split):
            search = _parts(name, module) + search
    if found is None:
        return None, None, modules
    name = found[0]
    rest = list(modules)
    # cut open every ancestor of the block still whole in the list, outermost first, then take the block out
    for at in (i for i, c in enumerate(name) if c == "."):
        names = [n for n, _ in rest]
        if name[:at] in names:
            i = names.index(name[:at])
            rest[i:i + 1] = _parts(*rest[i])
    i = [n for n, _ in rest].index(name)
    return name, rest.pop(i)[1], rest


def get_module_leaves(module_sizes: Mapping[str, int]) -> list[str]:
    """The names in `module_sizes` (besides "") that no other name there lies under, in order.

    On `compute_module_sizes` output these are tensor names; on module names only, the leaf modules.

    Example:
        >>> get_module_leaves({"": 3, "a": 2, "a.b": 2, "c": 1})
        ['a.b', 'c']
    """
    parents = {name.rpartition(".")[0] for name in module_sizes if "." in name}
    return [name for name in module_sizes if name and name not in parents]


def infer_auto_device_map(
    model: nn.Module,
    max_memory: Mapping[Any, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    dtype: str | torch.dtype | None = None,
    special_dtypes: Mapping[str, str | torch.dtype] | None = None,
    verbose: bool = False,
    clean_result: bool = True,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
) -> OrderedDict[str, int | str]:
    """Plan where each module of `model` goes: GPUs in order, then "cpu", then "disk", within `max_memory`.

    The map is Accelerate's for the same arguments. Modules are taken in
    definition order and put on the current device while they fit; one that
    does not fit is cut into its parameters and children (never a module
    whose class name is in `no_split_module_classes`), else the next device
    is used. The first GPU and the CPU keep room for the largest block,
    which is where offloaded blocks run. Tied parameters stay together. With
    `fallback_allocation`, a device that would stay empty first takes some
    smaller block that fits. "disk" is the last resort, unlimited unless
    `max_memory` gives it a budget (hasten honours one; Accelerate ignores it).
    Buffers of blocks on cpu/disk that would fit on no GPU are warned about
    unless `offload_buffers`.

    Example:
        >>> net = nn.Sequential(*[nn.Linear(100, 100) for _ in range(4)])  # 40400 bytes per layer
        >>> dict(infer_auto_device_map(net, max_memory={"cpu": 100_000}))
        {'0': 'cpu', '1': 'disk', '2': 'disk', '3': 'disk'}
    """
    budgets = get_max_memory(max_memory)
    no_split = _as_list(no_split_module_classes)
    devices = [*budgets, *(["disk"] if "disk" not in budgets else [])]
    gpus = [d for d in devices if d not in ("cpu", "disk")]
    runs_offloaded = ["mps"] if "mps" in gpus else ([gpus[0], "cpu"] if gpus else ["cpu"])
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    tied = find_tied_parameters(model)
    queue: list[Entry] = [*model.named_parameters(recurse=False), *model.named_children(), *model.named_buffers(recurse=False)]

    device_map: OrderedDict[str, int | str] = OrderedDict()
    used = dict.fromkeys(devices, 0)
    buffers_on: dict[Any, int] = {}
    first_need: dict[Any, int] = {}
    current = 0
    largest, largest_names = get_max_layer_size(queue, sizes, no_split)
    while queue:
        name, module = queue.pop(0)
        largest_names = [n for n in largest_names if n != name and not n.startswith(name + ".")]
        if not largest_names:  # the largest block was just taken: the reserve can shrink
            largest, largest_names = get_max_layer_size(_layers_of(queue), sizes, no_split)
        device = devices[current]
        reserve = largest if device in runs_offloaded else 0
        room = None if device == "disk" and "disk" not in budgets else budgets[device] - reserve
        size = sizes.get(name, 0)
        outside = _tied_outside(name, tied)
        needed, holder_names, holders = get_module_size_with_ties(outside, size, sizes, queue)
        if verbose:
            left = "unlimited" if room is None else room - used[device]
            print(f"{name} needs {needed} bytes (with its tied twins {holder_names}); {device} has {left} left.")

        if room is None or used[device] + needed <= room:
            used[device] += needed
            device_map[name] = device
            for holder in holder_names:
                queue = [(n, m) for n, m in queue if n != holder]
                device_map[holder] = device
            if not offload_buffers and isinstance(module, nn.Module):
                buffers_on[device] = buffers_on.get(device, 0) + compute_module_total_buffer_size(
                    module, dtype=dtype, special_dtypes=special_dtypes)
            continue

        if outside and used[device] + size <= room:
            # the module fits without its tied twins: cut the first twin's holder that can be cut, and retry
            cuttable = next(((n, m) for n, m in zip(holder_names, holders) if _splittable(m, no_split)), None)
            if cuttable is not None:
                at = next(i for i, (n, _) in enumerate(queue) if n == cuttable[0])
                queue = [(name, module), *queue[:at], *_parts(*cuttable), *queue[at + 1:]]
                largest, largest_names = get_max_layer_size(_layers_of(queue), sizes, no_split)
                continue
        if used[device] + size >= room and _splittable(module, no_split):
            queue = [*_parts(name, module), *queue]
            largest, largest_names = get_max_layer_size(_layers_of(queue), sizes, no_split)
            continue

        if fallback_allocation and used[device] == 0 and device != "disk":
            # some smaller block that fits beside the reserve (and beside this module, which comes back next)
            found = fallback_allocate(queue, sizes, budgets[device] - max(largest, needed), no_split, tied)
            if found[1] is not None:
                queue = [(cast(str, found[0]), found[1]), (name, module), *found[2]]
                continue

        if used[device] == 0:
            first_need[device] = needed + reserve
        if current + 1 == len(devices):
            budget_text = ", ".join(f"{d}: {budgets[d]}" for d in budgets)
            raise ValueError(f"{name!r} needs {needed} bytes and fits on no device of max_memory ({budget_text} bytes, "
                             f"{reserve} of {device}'s kept for the largest block); raise a budget or leave 'disk' unlimited.")
        used[device] += reserve  # the room kept for offloaded blocks counts as used when GPUs are checked for buffers
        current += 1
        queue.insert(0, (name, module))

    if clean_result:
        clean_device_map(device_map)  # in place, so the map stays the OrderedDict built above
    off_gpu = buffers_on.get("cpu", 0) + buffers_on.get("disk", 0)
    if gpus and off_gpu and not any(budgets[g] >= used.get(g, 0) + off_gpu for g in budgets if g not in ("cpu", "disk")):
        warnings.warn(f"Current model requires {off_gpu} bytes of buffer for the modules offloaded to cpu/disk, which fit "
                      "on no GPU beside its weights; if you run out of GPU memory, pass offload_buffers=True.", stacklevel=2)
    if first_need:
        needs = ", ".join(f"{device}: {need} bytes" for device, need in first_need.items())
        _log.info("no module could be put on these devices for insufficient memory (what the first one needed, with the "
                  "reserve for offloaded blocks): %s; give them at least that much or change the model.", needs)
    return device_map


def get_balanced_memory(
    model: nn.Module,
    max_memory: Mapping[Any, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    dtype: str | torch.dtype | None = None,
    special_dtypes: Mapping[str, str | torch.dtype] | None = None,
    low_zero: bool = False,
) -> dict[int | str, int]:
    """Per-device budgets that spread `model` evenly over the GPUs instead of filling the first ones.

    Each GPU but the last gets about model size / GPU count plus a margin
    (1.25 x the larger of the biggest no-split block and the mean leaf module);
    the last keeps its full budget. `low_zero` leaves GPU 0 as empty as
    possible (for generation outputs). Without GPUs, `max_memory` is returned
    as `get_max_memory` normalises it.

    Example:
        >>> net = nn.Sequential(*[nn.Linear(100, 100) for _ in range(4)])
        >>> get_balanced_memory(net, {0: 10**6, 1: 10**6, "cpu": 10**6})
        {0: 131300, 1: 1000000, 'cpu': 1000000}
    """
    user_gave_budgets = max_memory is not None
    budgets = get_max_memory(max_memory)
    gpus = sorted(d for d, budget in budgets.items() if isinstance(d, int) and budget > 0)
    if not gpus:
        return budgets
    if len(gpus) == 1:
        low_zero = False  # nothing to move GPU 0's share to
        if not user_gave_budgets:
            budgets[gpus[0]] = int(budgets[gpus[0]] * 0.9)  # measured free memory: leave headroom against OOM
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    share = sizes[""] // (len(gpus) - 1 if low_zero else len(gpus))

    # a plain even share is too small: rounding to whole blocks leaves every GPU a bit short, so add a margin
    no_split = _as_list(no_split_module_classes)
    block = 0
    if no_split:
        seen: set[str] = set()
        for name, module in model.named_modules():
            cls = module.__class__.__name__
            if name and cls in no_split and cls not in seen:
                seen.add(cls)
                block = max(block, sizes.get(name, 0))
    tensor_names = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    leaves = get_module_leaves({n: size for n, size in sizes.items() if n not in tensor_names})  # leaf modules
    mean_leaf = int(sum(sizes[n] for n in leaves) / max(len(leaves), 1))
    share += int(1.25 * max(block, mean_leaf))

    # as Accelerate: low_zero means GPU index 0 (even when it is not the first GPU with memory), and the others are
    # counted as indices 1 .. count-1
    for gpu in gpus[:-1]:  # the last GPU keeps its whole budget in case the margin was not enough
        budgets[gpu] = min(budgets[gpu] if low_zero and gpu == 0 else share, budgets[gpu])
    if low_zero and 0 in budgets:
        budgets[0] = min(max(0, sizes[""] - sum(budgets.get(g, 0) for g in range(1, len(gpus)))), budgets[0])
    return budgets


def check_device_map(model: nn.Module, device_map: Mapping[str, Any]) -> None:
    """Raise unless `device_map` gives a device to every tensor of `model`'s state dict; warn about keys naming nothing.

    A key must name a submodule or a tensor of `model` ("" names the whole
    model); others are listed in one `UserWarning` (they place nothing).

    Example:
        >>> check_device_map(nn.Sequential(nn.Linear(1, 1), nn.Linear(1, 1)), {"0": "cpu", "1": "disk"})
    """
    known = {name for name, _ in model.named_modules(remove_duplicate=False)}
    known.update(name for name, _ in model.named_parameters(remove_duplicate=False))
    known.update(name for name, _ in model.named_buffers(remove_duplicate=False))
    invalid = [key for key in device_map if key not in known]
    if invalid:
        warnings.warn(f"These device_map keys do not match any submodules (nor tensors) of the model and place nothing: "
                      f"{invalid}; check their spelling against model.named_modules().", UserWarning, stacklevel=2)
    if "" in device_map:
        return
    uncovered = [name for name in model.state_dict() if not any(_inside(name, key) for key in device_map)]
    if uncovered:
        shown = ", ".join(uncovered[:10]) + (f" and {len(uncovered) - 10} more" if len(uncovered) > 10 else "")
        raise ValueError(f"the device_map gives no device to {len(uncovered)} tensor(s) of the model: {shown}; "
                         "add their modules (or '') to the map.")


def clean_device_map(device_map: MutableMapping[str, Any], module_name: str = "") -> MutableMapping[str, Any]:
    """Merge entries into their parent wherever all entries under that parent share one device (in place, order kept).

    Example:
        >>> dict(clean_device_map(OrderedDict([("a.0", 0), ("a.1", 0), ("b", "cpu")])))
        {'a': 0, 'b': 'cpu'}
    """
    under = [k for k in device_map if not module_name or _inside(k, module_name)]
    if len(under) > 1 and len({str(device_map[k]) for k in under}) == 1:
        device = device_map[under[0]]
        merged = [(module_name, device) if k == under[0] else (k, v) for k, v in device_map.items() if k == under[0] or k not in under]
        device_map.clear()
        device_map.update(merged)
        return device_map
    depth = len(module_name.split(".")) if module_name else 0
    children = dict.fromkeys(".".join(k.split(".")[:depth + 1]) for k in under if k != module_name)
    for child in children:
        clean_device_map(device_map, child)
    return device_map
