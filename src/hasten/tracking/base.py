"""The tracker interface (Accelerate's `GeneralTracker`), the tracker names, and choosing trackers from `log_with`."""

from __future__ import annotations

import enum
import importlib.util
from typing import Any

from ..options import EnumWithContains

__all__ = ["LoggerType", "GeneralTracker", "missing_package_error"]


class LoggerType(str, enum.Enum, metaclass=EnumWithContains):
    """Names accepted by ``Accelerator(log_with=...)`` (``str()``, ``list()`` and ``in`` as Accelerate's enums).

    Example:
        >>> LoggerType.TENSORBOARD == "tensorboard", str(LoggerType.WANDB), "mlflow" in LoggerType
        (True, 'wandb', True)
    """

    def __str__(self) -> str:
        return self.value

    @classmethod
    def list(cls) -> list[str]:
        return [member.value for member in cls]

    ALL = "all"
    JSONL = "jsonl"
    CSV = "csv"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    MLFLOW = "mlflow"
    # names of the peer's other integrations: accepted, then refused with one sentence when used
    AIM = "aim"
    COMETML = "comet_ml"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"
    TRACKIO = "trackio"


class GeneralTracker:
    """Base class of every tracker; subclass it to write your own and pass an instance to `log_with`.

    A subclass sets `name` and `requires_logging_directory`, and implements
    `store_init_configuration`, `log` and (if needed) `finish`; `tracker`
    returns the backend's own object. `main_process_only = False` makes the
    Accelerator call it on every process.

    Example:
        >>> class Printer(GeneralTracker):
        ...     name = "printer"
        ...     requires_logging_directory = False
        ...     def log(self, values, step=None, **kwargs):
        ...         print(step, values)
        >>> Printer().log({"loss": 0.5}, step=1)
        1 {'loss': 0.5}
    """

    name: str = ""
    requires_logging_directory: bool = False
    main_process_only: bool = True

    def __init__(self, _blank: bool = False) -> None:
        if not _blank and not self.name:
            raise NotImplementedError(f"{type(self).__name__} must set the class attribute `name`.")

    @property
    def tracker(self) -> Any:
        """The backend's own object (a SummaryWriter, a wandb run, ...)."""
        return None

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Record the run's hyper-parameters."""

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Record `values` (name -> number, string or dict of numbers) at `step` (a blank tracker ignores them)."""
        if type(self) is not GeneralTracker:
            raise NotImplementedError(f"{type(self).__name__} must implement log(values, step=None, **kwargs).")

    def finish(self) -> None:
        """Flush and close."""


def missing_package_error(tracker: str, package: str, extra: str = "") -> ImportError:
    return ImportError(f"log_with={tracker!r} needs the {package} package, which is not installed: "
                       f"pip install {package}{extra}")


def is_installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
