"""Accelerate's trackers that hasten does not integrate: the classes exist with Accelerate's names and attributes,
so scripts import them, and creating one (or naming it in `log_with`) raises one sentence saying what to use.

Example:
    >>> from hasten.tracking.unintegrated import AimTracker
    >>> AimTracker.name, AimTracker.requires_logging_directory
    ('aim', True)
    >>> AimTracker("run")
    Traceback (most recent call last):
    ...
    NotImplementedError: log_with='aim' is a tracker this hasten version does not integrate; use one of ['csv', 'jsonl', 'mlflow', 'tensorboard', 'wandb'], or log to aim from your own GeneralTracker subclass (pip install aim) and pass an instance of it.
"""

from __future__ import annotations

import os
from typing import Any

from .base import GeneralTracker

__all__ = ["AimTracker", "ClearMLTracker", "CometMLTracker", "DVCLiveTracker", "SwanLabTracker", "TrackioTracker",
           "UnintegratedTracker", "refusal"]

INTEGRATED = ("csv", "jsonl", "mlflow", "tensorboard", "wandb")


def refusal(name: str, package: str) -> NotImplementedError:
    """The error for a tracker name hasten knows from Accelerate but does not integrate (raise it).

    Example:
        >>> "pip install trackio" in str(refusal("trackio", "trackio"))
        True
    """
    return NotImplementedError(f"log_with={name!r} is a tracker this hasten version does not integrate; use one of "
                               f"{list(INTEGRATED)}, or log to {name} from your own GeneralTracker subclass "
                               f"(pip install {package}) and pass an instance of it.")


class UnintegratedTracker(GeneralTracker):
    """Base of the trackers below: `package` is what `pip install` names; creating one raises `refusal(...)`.

    Example:
        >>> issubclass(AimTracker, UnintegratedTracker)
        True
    """

    package = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise refusal(self.name, self.package)


class AimTracker(UnintegratedTracker):
    """Accelerate's Aim tracker, not integrated: creating it raises `NotImplementedError` in one sentence.

    Example:
        >>> AimTracker.name
        'aim'
    """

    name, requires_logging_directory, package = "aim", True, "aim"

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str] | None = ".", **kwargs: Any) -> None:
        raise refusal(self.name, self.package)


class CometMLTracker(UnintegratedTracker):
    """Accelerate's Comet tracker, not integrated: creating it raises `NotImplementedError` in one sentence.

    Example:
        >>> CometMLTracker.name
        'comet_ml'
    """

    name, requires_logging_directory, package = "comet_ml", False, "comet-ml"

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        raise refusal(self.name, self.package)


class ClearMLTracker(UnintegratedTracker):
    """Accelerate's ClearML tracker, not integrated: creating it raises `NotImplementedError` in one sentence.

    Example:
        >>> ClearMLTracker.name
        'clearml'
    """

    name, requires_logging_directory, package = "clearml", False, "clearml"

    def __init__(self, run_name: str | None = None, **kwargs: Any) -> None:
        raise refusal(self.name, self.package)


class DVCLiveTracker(UnintegratedTracker):
    """Accelerate's DVCLive tracker, not integrated: creating it raises `NotImplementedError` in one sentence.

    Example:
        >>> DVCLiveTracker.name
        'dvclive'
    """

    name, requires_logging_directory, package = "dvclive", False, "dvclive"

    def __init__(self, run_name: str | None = None, live: Any = None, **kwargs: Any) -> None:
        raise refusal(self.name, self.package)


class SwanLabTracker(UnintegratedTracker):
    """Accelerate's SwanLab tracker, not integrated: creating it raises `NotImplementedError` in one sentence.

    Example:
        >>> SwanLabTracker.name
        'swanlab'
    """

    name, requires_logging_directory, package = "swanlab", False, "swanlab"
    main_process_only = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        raise refusal(self.name, self.package)


class TrackioTracker(UnintegratedTracker):
    """Accelerate's Trackio tracker, not integrated: creating it raises `NotImplementedError` in one sentence.

    Example:
        >>> TrackioTracker.name
        'trackio'
    """

    name, requires_logging_directory, package = "trackio", False, "trackio"
    main_process_only = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        raise refusal(self.name, self.package)
