"""Walking a model's module tree: children bottom-up, a class found by name, DTensor parameters.

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

__all__ = ["get_module_children_bottom_up", "get_module_class_from_name", "get_parameters_from_modules",
           "model_has_dtensor"]


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

    Example:
        >>> from torch import nn
        >>> model_has_dtensor(nn.Linear(2, 2))
        False
    """
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
