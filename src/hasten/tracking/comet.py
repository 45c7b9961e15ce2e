"""Comet (``comet_ml``): an experiment in a project; offline with ``online=False`` and an ``ExperimentConfig``.

Offline, Comet writes one zip archive per experiment into
``ExperimentConfig(offline_directory=...)`` (its ``messages.json`` holds the
parameters, metrics and others), which ``comet upload`` sends later.
"""

from __future__ import annotations

import logging
from typing import Any

from .base import GeneralTracker, as_number, is_installed, missing_package_error, on_main_process

__all__ = ["CometMLTracker"]

_log = logging.getLogger(__name__)


class CometMLTracker(GeneralTracker):
    """``comet_ml.start(project_name=run_name, **kwargs)`` at `start()` (``comet_ml.Experiment`` before Comet 3.41).

    The API key comes from Comet's own configuration (``COMET_API_KEY`` or
    ``~/.comet.config``), as in Accelerate. `log` sends numbers as metrics at
    `step`, strings as "others" and dicts of numbers as metrics; one-element
    tensors count as numbers, and other values are skipped with a warning.

    Example:
        >>> from hasten.tracking import CometMLTracker
        >>> CometMLTracker.name, CometMLTracker.requires_logging_directory, CometMLTracker.main_process_only
        ('comet_ml', False, True)

    Offline, as a script would use it::

        tracker = CometMLTracker("my-project", online=False,
                                 experiment_config=comet_ml.ExperimentConfig(offline_directory="comet"))
        accelerator = Accelerator(log_with=tracker)
    """

    name = "comet_ml"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        if not is_installed("comet_ml"):
            raise missing_package_error("comet_ml", "comet_ml")
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.writer: Any = None
        self._skipped: set[str] = set()  # names already warned about

    @on_main_process
    def start(self) -> None:
        import comet_ml

        if hasattr(comet_ml, "start"):  # Comet >= 3.41: reuses a running experiment, knows `online=False`
            self.writer = comet_ml.start(project_name=self.run_name, **self.init_kwargs)
        else:
            self.writer = comet_ml.Experiment(project_name=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        """The ``comet_ml`` experiment (None before `start()`)."""
        return self.writer

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Log `values` as the experiment's parameters (``Experiment.log_parameters``)."""
        self.writer.log_parameters(values)

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers as metrics, strings as others, dicts as metrics; `kwargs` go to each of those Comet calls."""
        if step is not None:
            self.writer.set_step(step)
        for key, value in values.items():
            value = as_number(value)
            if isinstance(value, (int, float)):
                self.writer.log_metric(key, value, step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.log_other(key, value, **kwargs)
            elif isinstance(value, dict):
                self.writer.log_metrics({k: as_number(v) for k, v in value.items()}, step=step, **kwargs)
            elif key not in self._skipped:  # as Accelerate, the value is left out; unlike it, the user hears of it
                self._skipped.add(key)
                _log.warning("Comet skips %s: a %s is not a number, a string or a dict of numbers.",
                             key, type(value).__name__)

    @on_main_process
    def finish(self) -> None:
        """End the experiment (offline: write its archive)."""
        self.writer.end()
