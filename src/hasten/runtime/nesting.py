"""Nested batches (lists, tuples, dicts, dataclasses of tensors): apply a function to every leaf, or move them all.

Kept apart from `collectives` (which needs the process group, the board and the
watchdog) so that what only walks a batch — casting a forward's outputs to fp32,
moving a batch to its device — imports nothing more.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Callable, cast

import torch

__all__ = ["recursively_apply", "send_to_device"]


def _is_tensor(data: Any) -> bool:
    return isinstance(data, torch.Tensor)


def recursively_apply(func: Callable[..., Any], data: Any, *args: Any, test_type: Callable[[Any], bool] | None = None,
                      error_on_other_type: bool = False, **kwargs: Any) -> Any:
    """Apply `func(leaf, *args, **kwargs)` to every leaf inside nested lists, tuples, dicts and dataclasses, keeping their types.

    A leaf is what `test_type` accepts (default: a tensor). Other leaves are
    returned as they are, or refused with `error_on_other_type=True`.

    Example:
        >>> recursively_apply(lambda t: t * 2, {"a": [torch.tensor(1)]})
        {'a': [tensor(2)]}
        >>> recursively_apply(lambda t, k: t + k, (torch.tensor(1), "x"), 10)
        (tensor(11), 'x')
    """
    is_leaf = _is_tensor if test_type is None else test_type

    def walk(item: Any) -> Any:
        if is_leaf(item):
            return func(item, *args, **kwargs)
        if isinstance(item, (list, tuple)):
            items = [walk(part) for part in item]
            if hasattr(item, "_fields"):  # namedtuple
                return type(item)(*items)
            return type(item)(items)
        if isinstance(item, Mapping):
            applied = {key: walk(value) for key, value in item.items()}
            try:
                return cast(Any, type(item))(applied)  # dict, OrderedDict, BatchEncoding-like mappings
            except TypeError:
                return applied
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            changes = {f.name: walk(getattr(item, f.name)) for f in dataclasses.fields(item) if f.init}
            return dataclasses.replace(item, **changes)
        if error_on_other_type:  # Accelerate's exact sentence: callers compare it
            kind = "is_torch_tensor" if test_type is None else getattr(test_type, "__name__", "test_type")
            raise TypeError(f"Unsupported types ({type(item)}) passed to `{getattr(func, '__name__', func)}`. Only "
                            f"nested list/tuple/dicts of objects that are valid for `{kind}` should be passed.")
        return item

    return walk(data)


def send_to_device(tensor: Any, device: torch.device | str, non_blocking: bool = False,
                   skip_keys: str | list[str] | None = None) -> Any:
    """Move every tensor in a nested batch to `device`; other leaves are kept.

    Objects with their own `.to` (e.g. a `transformers` BatchEncoding) use it;
    values under a key in `skip_keys` (at any depth) stay where they are.

    Example:
        >>> send_to_device({"x": torch.zeros(2)}, "cpu")["x"].device
        device(type='cpu')
        >>> send_to_device({"x": torch.zeros(2), "ids": [1]}, "cpu", skip_keys="ids")["ids"]
        [1]
    """
    if skip_keys is not None:
        skip = [skip_keys] if isinstance(skip_keys, str) else list(skip_keys)
        if isinstance(tensor, Mapping):
            moved = {k: v if k in skip else send_to_device(v, device, non_blocking, skip) for k, v in tensor.items()}
            try:
                return cast(Any, type(tensor))(moved)
            except TypeError:
                return moved
        if isinstance(tensor, (list, tuple)):
            items = [send_to_device(part, device, non_blocking, skip) for part in tensor]
            return type(tensor)(*items) if hasattr(tensor, "_fields") else type(tensor)(items)
    if not isinstance(tensor, (torch.Tensor, list, tuple, Mapping)) and hasattr(tensor, "to") and not dataclasses.is_dataclass(tensor):
        try:
            return tensor.to(device, non_blocking=non_blocking)
        except TypeError:
            return tensor.to(device)
    return recursively_apply(lambda t: t.to(device, non_blocking=non_blocking), tensor)
