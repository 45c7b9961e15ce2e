"""Experiment trackers with Accelerate's API: one module per backend, the backend package imported only when a run starts.

`LOGGER_TYPE_TO_CLASS` maps every name `log_with` accepts to its class;
`register_tracker_class` adds a user's tracker to it.

Example:
    >>> from hasten.tracking import LOGGER_TYPE_TO_CLASS, available_trackers
    >>> "jsonl" in available_trackers(), LOGGER_TYPE_TO_CLASS["tensorboard"].__name__
    (True, 'TensorBoardTracker')
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

from .aim import AimTracker
from .base import GeneralTracker, LoggerType, is_installed, on_main_process
from .clearml import ClearMLTracker
from .comet import CometMLTracker
from .csv import CSVTracker
from .dvclive import DVCLiveTracker
from .jsonl import JSONLinesTracker
from .mlflow import MLflowTracker
from .swanlab import SwanLabTracker
from .tensorboard import TensorBoardTracker
from .trackio import TrackioTracker
from .wandb import WandBTracker

__all__ = ["LoggerType", "GeneralTracker", "on_main_process", "JSONLinesTracker", "CSVTracker", "TensorBoardTracker",
           "WandBTracker", "MLflowTracker", "AimTracker", "ClearMLTracker", "CometMLTracker", "DVCLiveTracker",
           "SwanLabTracker", "TrackioTracker", "LOGGER_TYPE_TO_CLASS", "register_tracker_class", "available_trackers",
           "get_available_trackers", "resolve_log_with", "filter_trackers", "start_tracker"]

# Every name `log_with` accepts -> its class (Accelerate's dict: tests and libraries read and extend it).
LOGGER_TYPE_TO_CLASS: dict[str, type[GeneralTracker]] = {
    "jsonl": JSONLinesTracker, "csv": CSVTracker, "tensorboard": TensorBoardTracker, "wandb": WandBTracker,
    "mlflow": MLflowTracker, "aim": AimTracker, "comet_ml": CometMLTracker, "clearml": ClearMLTracker,
    "dvclive": DVCLiveTracker, "swanlab": SwanLabTracker, "trackio": TrackioTracker,
}

# The built-in trackers that need a package: name -> the modules that provide it, any one will do.
_PACKAGES: dict[str, tuple[str, ...]] = {
    "tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",), "mlflow": ("mlflow",), "aim": ("aim",),
    "comet_ml": ("comet_ml",), "clearml": ("clearml",), "dvclive": ("dvclive",), "swanlab": ("swanlab",),
    "trackio": ("trackio",)}
# What "all" may pick, in this order: hasten's file trackers, then Accelerate's in its own order.
_BUILT_IN = ("jsonl", "csv", "tensorboard", "wandb", "comet_ml", "aim", "mlflow", "clearml", "dvclive", "swanlab",
             "trackio")


def register_tracker_class(tracker_class: type[GeneralTracker]) -> None:
    """Make a `GeneralTracker` subclass usable by its `name` in ``Accelerator(log_with=...)``.

    The class needs a non-empty `name` and a `requires_logging_directory`
    class attribute. `init_trackers` creates it as
    ``tracker_class(project_name, **init_kwargs[name])``, with the logging
    directory as second argument when it requires one. A name already
    registered (a built-in one too) is replaced, with a warning.

    Example:
        >>> class Printer(GeneralTracker):
        ...     name, requires_logging_directory = "printer", False
        ...     def __init__(self, run_name, **kwargs):
        ...         super().__init__()
        >>> register_tracker_class(Printer)
        >>> LOGGER_TYPE_TO_CLASS["printer"] is Printer
        True
    """
    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise ValueError(f"register_tracker_class got {tracker_class!r}; pass a subclass of GeneralTracker (the class, "
                         "not an instance).")
    name = getattr(tracker_class, "name", None)
    if not name:
        raise ValueError(f"{tracker_class.__name__} has no `name` to register it under; set a non-empty class "
                         "attribute `name`.")
    if not hasattr(tracker_class, "requires_logging_directory"):
        raise ValueError(f"{tracker_class.__name__} must define the class attribute `requires_logging_directory`: "
                         "True if it writes to the logging directory, else False.")
    if name in LOGGER_TYPE_TO_CLASS:
        warnings.warn(f"register_tracker_class replaces the tracker registered as '{name}' "
                      f"({LOGGER_TYPE_TO_CLASS[name].__name__}) by {tracker_class.__name__}.", UserWarning,
                      stacklevel=2)
    LOGGER_TYPE_TO_CLASS[name] = tracker_class


def _installed(name: str) -> bool:
    modules = _PACKAGES.get(name)
    return modules is None or any(is_installed(module) for module in modules)


def available_trackers() -> list[str]:
    """Names of the built-in trackers whose packages are installed (what ``log_with="all"`` uses).

    Example:
        >>> available_trackers()[:2]
        ['jsonl', 'csv']
    """
    return [name for name in _BUILT_IN if _installed(name)]


get_available_trackers = available_trackers  # Accelerate's name


def _name_of(item: Any) -> str:
    """The registry key a `log_with` entry names (exact first, as registered; else lower-case, as LoggerType)."""
    name = item.value if isinstance(item, LoggerType) else str(item)
    return name if name in LOGGER_TYPE_TO_CLASS else name.lower()


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
        name = _name_of(item)
        if name == "all":
            for found in available_trackers():
                if not (LOGGER_TYPE_TO_CLASS[found].requires_logging_directory and logging_dir is None):
                    chosen.append(found)
            continue
        cls = LOGGER_TYPE_TO_CLASS.get(name)
        if cls is None:
            raise ValueError(f"log_with got an unknown tracker {item!r}; use one of {sorted(LOGGER_TYPE_TO_CLASS)}, "
                             "'all', a name given to register_tracker_class, or a GeneralTracker instance.")
        if not _installed(name):
            module = _PACKAGES[name][0]
            raise ImportError(f"log_with={name!r} needs the {module} package, which is not installed: "
                              f"pip install {module}")
        if cls.requires_logging_directory and logging_dir is None:
            raise ValueError(f"Logging with `{name}` requires a `logging_dir` to be passed in: give "
                             "Accelerator(project_dir=...) or ProjectConfiguration(logging_dir=...).")
        chosen.append(name)
    unique: list[str | GeneralTracker] = []
    for item in chosen:
        if item not in unique:
            unique.append(item)
    return unique


filter_trackers = resolve_log_with  # Accelerate's name


def start_tracker(name: str, project_name: str, logging_dir: str | None, kwargs: dict[str, Any]) -> GeneralTracker:
    """Create the tracker registered as `name` for `project_name` (what `init_trackers` does for each name).

    The tracker is created, not started: the caller calls its `start()`.

    Example:
        >>> import tempfile
        >>> start_tracker("jsonl", "run", tempfile.mkdtemp(), {}).path.name
        'metrics.jsonl'
    """
    cls: Any = LOGGER_TYPE_TO_CLASS[name]  # each class has its own constructor arguments
    if cls.requires_logging_directory:
        return cls(project_name, logging_dir, **kwargs)
    if (logging_dir is not None and cls.__module__.startswith(f"{__name__}.")
            and "logging_dir" in inspect.signature(cls).parameters):
        # hasten's own trackers that can keep files (MLflow's store) put them in the logging directory
        kwargs = {"logging_dir": logging_dir, **kwargs}
    return cls(project_name, **kwargs)
