"""Experiment trackers with Accelerate's API; one module per backend, each imported only when used.

Example:
    >>> from hasten.tracking import LoggerType, GeneralTracker, available_trackers
    >>> "jsonl" in available_trackers()
    True
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from .base import GeneralTracker, LoggerType, is_installed

__all__ = ["LoggerType", "GeneralTracker", "JSONLinesTracker", "CSVTracker", "TensorBoardTracker", "WandBTracker",
           "MLflowTracker", "available_trackers", "resolve_log_with", "start_tracker"]

# name -> (module, class, package that must be installed, or None)
_BACKENDS: dict[str, tuple[str, str, str | None]] = {
    "jsonl": ("jsonl", "JSONLinesTracker", None),
    "csv": ("csv", "CSVTracker", None),
    "tensorboard": ("tensorboard", "TensorBoardTracker", "tensorboard|tensorboardX"),
    "wandb": ("wandb", "WandBTracker", "wandb"),
    "mlflow": ("mlflow", "MLflowTracker", "mlflow"),
}


def __getattr__(name: str) -> Any:  # the backend classes, imported on first use
    for module, cls, _ in _BACKENDS.values():
        if cls == name:
            return getattr(importlib.import_module(f".{module}", __name__), cls)
    raise AttributeError(f"module 'hasten.tracking' has no attribute {name!r}")


def _installed(package: str | None) -> bool:
    return package is None or any(is_installed(p) for p in package.split("|"))


def available_trackers() -> list[str]:
    """Names of the trackers whose packages are installed (what ``log_with="all"`` uses)."""
    return [name for name, (_, _, package) in _BACKENDS.items() if _installed(package)]


def tracker_class(name: str) -> type[GeneralTracker]:
    module, cls, _ = _BACKENDS[name]
    return getattr(importlib.import_module(f".{module}", __name__), cls)


def resolve_log_with(log_with: Any, logging_dir: str | None) -> list[str | GeneralTracker]:
    """Validate `log_with` once: tracker names (checked) and tracker objects, in order, without duplicates.

    Example:
        >>> resolve_log_with(["jsonl", "csv"], "runs")
        ['jsonl', 'csv']
    """
    if log_with is None:
        return []
    items = log_with if isinstance(log_with, (list, tuple)) else [log_with]
    chosen: list[str | GeneralTracker] = []
    for item in items:
        if isinstance(item, GeneralTracker):
            chosen.append(item)
            continue
        name = item.value if isinstance(item, LoggerType) else str(item).lower()
        if name == "all":
            for found in available_trackers():
                if not (tracker_class(found).requires_logging_directory and logging_dir is None):
                    chosen.append(found)
            continue
        if name in {t.value for t in LoggerType} and name not in _BACKENDS:
            raise NotImplementedError(f"log_with={name!r} is a tracker this hasten version does not integrate; "
                                      f"use one of {sorted(_BACKENDS)} or pass a GeneralTracker subclass instance.")
        if name not in _BACKENDS:
            raise ValueError(f"log_with got an unknown tracker {item!r}; use one of {sorted(_BACKENDS)}, 'all', "
                             "or a GeneralTracker instance.")
        _, _, package = _BACKENDS[name]
        if package is not None and not _installed(package):
            raise ImportError(f"log_with={name!r} needs the {package.split('|')[0]} package, which is not installed: "
                              f"pip install {package.split('|')[0]}")
        if tracker_class(name).requires_logging_directory and logging_dir is None:
            raise ValueError(f"log_with={name!r} writes files and needs a logging directory; pass "
                             "Accelerator(project_dir=...) or ProjectConfiguration(logging_dir=...).")
        chosen.append(name)
    unique: list[str | GeneralTracker] = []
    for item in chosen:
        if item not in unique:
            unique.append(item)
    return unique


def start_tracker(name: str, project_name: str, logging_dir: str | None, kwargs: dict[str, Any]) -> GeneralTracker:
    """Create the named tracker for `project_name` (what `init_trackers` does for each name)."""
    cls: Any = tracker_class(name)  # a backend class: its own constructor arguments
    if cls.requires_logging_directory:
        return cls(project_name, logging_dir, **kwargs)
    if logging_dir is not None and "logging_dir" in inspect.signature(cls).parameters:
        kwargs = {"logging_dir": logging_dir, **kwargs}
    return cls(project_name, **kwargs)
