"""Small helpers over plain Python values: a dotted `getattr`, a recursive dict merge, a readable name, byte counts.

The peer's path for these is ``accelerate.utils.other``.

Example:
    >>> from hasten.core.objects import merge_dicts, recursive_getattr
    >>> merge_dicts({"a": {"b": 1}}, {"a": {"c": 2}})
    {'a': {'c': 2, 'b': 1}}
"""

from __future__ import annotations

from typing import Any

__all__ = ["convert_bytes", "get_pretty_name", "merge_dicts", "recursive_getattr"]


def get_pretty_name(obj: Any) -> str:
    """A readable name for a class, function or object.

    Example:
        >>> get_pretty_name(dict)
        'dict'
    """
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or str(obj)


def merge_dicts(source: dict[str, Any], destination: dict[str, Any]) -> dict[str, Any]:
    """Merge `source` into `destination` recursively (nested dicts merged, other values replaced); returns it.

    Example:
        >>> merge_dicts({"a": {"b": 1}}, {"a": {"c": 2}})
        {'a': {'c': 2, 'b': 1}}
    """
    for key, value in source.items():
        if isinstance(value, dict):
            merge_dicts(value, destination.setdefault(key, {}))
        else:
            destination[key] = value
    return destination


def recursive_getattr(obj: Any, attr: str) -> Any:
    """`getattr` along a dotted path.

    Example:
        >>> import torch
        >>> recursive_getattr(torch.nn.Sequential(torch.nn.Linear(1, 2)), "0.out_features")
        2
    """
    for name in attr.split("."):
        obj = getattr(obj, name)
    return obj


def convert_bytes(size: float) -> str:
    """A byte count in readable units.

    Example:
        >>> convert_bytes(3 * 1024**2)
        '3.0 MB'
    """
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"
