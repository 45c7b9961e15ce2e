"""Small helpers over plain Python values: a dotted `getattr`, a recursive dict merge, a readable name, byte counts,
a function that does nothing and a per-thread shared dict.

The peer's path for these is ``accelerate.utils.other`` (the last two: ``accelerate.state``).

Example:
    >>> from hasten.core.objects import merge_dicts, recursive_getattr
    >>> merge_dicts({"a": {"b": 1}}, {"a": {"c": 2}})
    {'a': {'c': 2, 'b': 1}}
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["convert_bytes", "get_pretty_name", "merge_dicts", "recursive_getattr", "do_nothing", "ThreadLocalSharedDict"]


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


def do_nothing(*args: Any, **kwargs: Any) -> None:
    """Accept anything, do nothing, return None (what a rank-filtered call becomes on the other processes).

    Example:
        >>> do_nothing(1, key="value") is None
        True
    """
    return None


class ThreadLocalSharedDict(threading.local):
    """A class attribute holding one dict per thread, shared by the class and its instances (a descriptor).

    Accelerate keeps its shared state in one on TPUs (one thread per
    device); hasten's state is per process and never needs it, but scripts
    may use the class. Replace the dict through an instance
    (``obj.attr = {...}``); assigning on the class replaces the descriptor.

    Example:
        >>> class Shared:
        ...     state = ThreadLocalSharedDict()
        >>> Shared().state["device"] = "cpu"
        >>> Shared.state
        {'device': 'cpu'}
    """

    def __init__(self, thread_local: bool = False) -> None:
        self._storage: dict[str, Any] = {}

    def __get__(self, obj: Any, objtype: Any = None) -> dict[str, Any]:
        return self._storage

    def __set__(self, obj: Any, value: dict[str, Any]) -> None:
        self._storage = value
