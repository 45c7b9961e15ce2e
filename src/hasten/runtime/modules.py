"""Walking a model's module tree: children bottom-up, a class found by name, DTensor parameters; parameters by name.

The peer's paths for these are ``accelerate.utils.other`` (`get_module_children_bottom_up`, `model_has_dtensor`)
and ``accelerate.utils.dataclasses`` (`get_module_class_from_name`); the FSDP helpers use them to pick wrap units.

Example:
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    >>> [type(m).__name__ for m in get_module_children_bottom_up(model)]
    ['Linear', 'ReLU', 'Sequential']
"""

from __future__ import annotations

import re
from typing import Any, Iterable

import torch
from torch import nn

from ..core.availability import is_torch_distributed_available

__all__ = ["get_module_children_bottom_up", "get_module_class_from_name", "get_parameters_from_modules",
           "model_has_dtensor", "named_parameters_of", "parameter_id", "replaced_parameters"]


def parameter_id(param: torch.Tensor) -> int:
    """A key matching a parameter across preparation: its storage address (a DTensor's local one), or for a meta
    parameter (every one has address 0) its identity.

    Example:
        >>> weight = nn.Parameter(torch.ones(2))
        >>> parameter_id(weight) == weight.data_ptr()
        True
    """
    if param.is_meta:
        return id(param)
    inner = getattr(param, "_tensor", None)  # torchao's float8 all-gather weight: its data_ptr() is 0
    if isinstance(inner, torch.Tensor) and type(param).__name__ == "WeightWithDynamicFloat8CastTensor":
        return inner.data_ptr()
    local = getattr(param, "_local_tensor", None)  # a DTensor
    return (local if isinstance(local, torch.Tensor) else param).data_ptr()


def named_parameters_of(*objects: Any, ids: bool = False) -> dict[str, Any]:
    """The parameters of the models among `objects` (unwrapped, compiled or not) by name; each name starts with the
    model's position among them when there are several. `ids=True` gives `parameter_id`s instead of the tensors.

    Example:
        >>> sorted(named_parameters_of(nn.Linear(2, 1), "not a model"))
        ['bias', 'weight']
    """
    from .unwrap import extract_model_from_parallel

    models = [obj for obj in objects if isinstance(obj, nn.Module)]
    named: dict[str, Any] = {}
    for index, model in enumerate(models):
        model = extract_model_from_parallel(model, keep_torch_compile=False)
        for name, param in model.named_parameters(prefix=str(index) if len(models) > 1 else ""):
            named[name] = parameter_id(param) if ids else param
    return named


def replaced_parameters(before: dict[str, torch.Tensor], *objects: Any) -> dict[torch.Tensor, torch.Tensor]:
    """Old parameter -> new one, for each name of `before` whose parameter preparation replaced in `objects`' models.

    Example:
        >>> model = nn.Linear(2, 1); before = named_parameters_of(model)
        >>> model.weight = nn.Parameter(model.weight.detach().clone())
        >>> list(replaced_parameters(before, model).values()) == [model.weight]
        True
    """
    after = named_parameters_of(*objects)
    return {old: after[name] for name, old in before.items() if name in after and after[name] is not old}


def get_module_children_bottom_up(model: nn.Module, return_fqns: bool = False) -> list[Any]:
    """Every module under `model`, each after all of its children (children in order); `model` itself last.

    With `return_fqns`, items are ``(qualified name, module)`` pairs (the
    root's name is ""). A module reachable under two parents is listed under each.

    Example:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Sequential(nn.Linear(2, 2)), nn.ReLU())
        >>> [name for name, _ in get_module_children_bottom_up(model, return_fqns=True)]
        ['0.0', '0', '1', '']
    """
    ordered: list[tuple[str, nn.Module]] = []
    # Iterative post-order (deep models would exhaust Python's recursion): (name, module, children expanded?).
    pending: list[tuple[str, nn.Module, bool]] = [("", model, False)]
    while pending:
        name, module, expanded = pending.pop()
        if expanded:
            ordered.append((name, module))
            continue
        pending.append((name, module, True))
        children = [(f"{name}.{child_name}" if name else child_name, child) for child_name, child in module.named_children()]
        pending.extend((child_name, child, False) for child_name, child in reversed(children))
    return ordered if return_fqns else [module for _, module in ordered]


def get_module_class_from_name(module: nn.Module, name: str) -> type[nn.Module] | None:
    """The class of the first module (depth first, `module` included) whose class is called `name`; None if none is.

    Example:
        >>> from torch import nn
        >>> get_module_class_from_name(nn.Sequential(nn.Linear(2, 2)), "Linear")
        <class 'torch.nn.modules.linear.Linear'>
    """
    pending = [module]
    while pending:
        current = pending.pop()
        if type(current).__name__ == name:
            return type(current)
        pending.extend(reversed(list(current.children())))
    return None


def model_has_dtensor(model: nn.Module) -> bool:
    """True when some parameter of `model` is a DTensor (split by FSDP2 or tensor parallelism).

    A torch built without torch.distributed (which cannot import DTensor) holds none: False.

    Example:
        >>> from torch import nn
        >>> model_has_dtensor(nn.Linear(2, 2))
        False
    """
    if not is_torch_distributed_available():
        return False
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def get_parameters_from_modules(modules: Iterable[nn.Module] | str | None, model: nn.Module,
                                device: torch.device | str) -> set[nn.Parameter]:
    """The parameters of `modules`: modules, or a regular expression matched against `model`'s module names.

    Modules found by the expression are moved to `device` first (they stay
    out of sharding, so they must already sit where the run computes).

    Example:
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
        >>> len(get_parameters_from_modules("1", model, "cpu"))
        2
    """
    if modules is None:
        return set()
    if isinstance(modules, str):
        pattern = re.compile(modules)
        modules = [module.to(device) for name, module in model.named_modules() if pattern.fullmatch(name)]
    return {parameter for module in modules for parameter in module.parameters()}
