"""The tracker interface (Accelerate's `GeneralTracker`), the tracker names, and choosing trackers from `log_with`."""

from __future__ import annotations

import enum
import functools
import importlib.util
import inspect
from typing import Any, Callable

from ..options import EnumWithContains

__all__ = ["LoggerType", "GeneralTracker", "on_main_process", "missing_package_error", "as_number", "update_config"]


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
    AIM = "aim"
    COMETML = "comet_ml"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"
    TRACKIO = "trackio"


def _is_main_process() -> bool:
    """Rank 0 of the launch, read from the launcher's environment (this layer sits below `PartialState`)."""
    from ..process.topology import ProcessTopology

    try:
        return ProcessTopology.from_env().rank == 0
    except ValueError:  # variables that name no launch: a plain single process
        return True


def on_main_process(function: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a tracker method so it runs only on the main process when the tracker's `main_process_only` is set.

    The check happens at each call, not at decoration, so creating a tracker
    touches no process state (Accelerate's deferred start).

    Example:
        >>> class Printer(GeneralTracker):
        ...     name, requires_logging_directory = "printer", False
        ...     @on_main_process
        ...     def log(self, values, step=None, **kwargs):
        ...         print(values)
        >>> Printer().log({"loss": 0.5})
        {'loss': 0.5}
    """

    @functools.wraps(function)
    def main_process_only(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "main_process_only", False) and not _is_main_process():
            return None
        return function(self, *args, **kwargs)

    return main_process_only


class GeneralTracker:
    """Base class of every tracker; subclass it to write your own and pass an instance (or its registered name) to `log_with`.

    A subclass sets the class attributes `name` and `requires_logging_directory`,
    implements `store_init_configuration`, `log` and (if needed) `start` and
    `finish`; `tracker` returns the backend's own object. Creating a tracker
    only records its arguments: `Accelerator.init_trackers` calls `start()`
    (where a backend opens its run) once the processes are set up. Trackers
    run on the main process; `main_process_only = False` lets the methods
    decorated with `on_main_process` run wherever they are called.

    Example:
        >>> class Printer(GeneralTracker):
        ...     name = "printer"
        ...     requires_logging_directory = False
        ...     def log(self, values, step=None, **kwargs):
        ...         print(step, values)
        >>> Printer().log({"loss": 0.5}, step=1)
        1 {'loss': 0.5}
    """

    # Declared, not defined: a subclass must define both (register_tracker_class and __init__ check).
    name: str
    requires_logging_directory: bool
    main_process_only: bool = True

    def __init__(self, _blank: bool = False) -> None:
        if _blank:
            return
        missing = [attr for attr in ("name", "requires_logging_directory") if not hasattr(self, attr)]
        if not getattr(self, "name", "x"):
            missing.insert(0, "name")
        if missing:
            raise NotImplementedError(f"{type(self).__name__} must set the class attribute `{missing[0]}`"
                                      + "".join(f" and `{m}`" for m in missing[1:])
                                      + " in its class definition.")

    @property
    def tracker(self) -> Any:
        """The backend's own object (a SummaryWriter, a wandb run, ...)."""
        return None

    def start(self) -> None:
        """Open the backend's run; `Accelerator.init_trackers` calls it after the process group is set up."""

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


def as_number(value: Any) -> Any:
    """A one-element tensor or NumPy scalar as the Python number it holds; anything else unchanged.

    Example:
        >>> import torch
        >>> as_number(torch.tensor([0.5])), as_number("text")
        (0.5, 'text')
    """
    if hasattr(value, "item") and callable(value.item) and getattr(value, "numel", lambda: 1)() == 1:
        return value.item()
    return value


def update_config(config: Any, values: dict[str, Any]) -> None:
    """Merge `values` into a backend's run config, letting them replace earlier values where the backend asks for that.

    Accelerate passes ``allow_val_change=True`` to every backend's ``update``;
    SwanLab 0.10's config and Trackio's (a plain dict) have no such parameter
    and would store it as one more config entry, so it is passed only where
    ``update`` names it.

    Example:
        >>> config = {"lr": 0.1}
        >>> update_config(config, {"lr": 0.2, "layers": 3})
        >>> config
        {'lr': 0.2, 'layers': 3}
    """
    try:
        named = "allow_val_change" in inspect.signature(config.update).parameters
    except (TypeError, ValueError):  # a builtin such as dict.update: no signature, no such parameter
        named = False
    if named:
        config.update(values, allow_val_change=True)
    else:
        config.update(values)
