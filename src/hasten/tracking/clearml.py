"""ClearML: a `Task` per run; offline with ``Task.set_offline(True)`` (the session lands under ``CLEARML_CACHE_DIR``).

Offline, the task's folder (``clearml.config.get_offline_dir(task_id=...)``)
holds ``task.json`` (the configuration), ``metrics.jsonl`` (scalars, single
values, tables) and ``data/`` (images), zipped at the end for
``clearml-task --import-offline-session``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from .base import GeneralTracker, as_number, is_installed, missing_package_error, on_main_process

__all__ = ["ClearMLTracker", "title_and_series"]

_log = logging.getLogger(__name__)


def title_and_series(name: str) -> tuple[str, str]:
    """ClearML's (title, series) for a name: its ``eval_``/``test_``/``train_`` prefix is the series, else "train".

    Example:
        >>> title_and_series("eval_loss"), title_and_series("loss")
        (('loss', 'eval'), ('loss', 'train'))
    """
    for prefix in ("eval", "test", "train"):
        if name.startswith(prefix + "_"):
            return name[len(prefix) + 1:], prefix
    return name, "train"


class ClearMLTracker(GeneralTracker):
    """``clearml.Task.init(project_name=..., task_name=..., **kwargs)`` at `start()`, or the task already running.

    The project and task names are, in order: ``project_name``/``task_name``
    in `kwargs`, ``CLEARML_PROJECT``/``CLEARML_TASK``, then `run_name`. A task
    started before (``Task.init`` in the script) is used as it is, and
    `finish` leaves it open for its owner to close. The config becomes the
    task's "General" configuration.

    Example:
        >>> from hasten.tracking import ClearMLTracker
        >>> ClearMLTracker.name, ClearMLTracker.requires_logging_directory, ClearMLTracker.main_process_only
        ('clearml', False, True)

    Offline, as a script would use it::

        clearml.Task.set_offline(True)
        accelerator = Accelerator(log_with="clearml")
        accelerator.init_trackers("my-project", config={"lr": 0.01})
    """

    name = "clearml"
    requires_logging_directory = False

    def __init__(self, run_name: str | None = None, **kwargs: Any) -> None:
        super().__init__()
        if not is_installed("clearml"):
            raise missing_package_error("clearml", "clearml")
        self.user_provided_run_name = run_name
        self.init_kwargs = kwargs
        self.task: Any = None
        self._initialized_externally = False  # a task the script started: not ours to close
        self._skipped: set[str] = set()  # names already warned about

    @on_main_process
    def start(self) -> None:
        from clearml import Task

        running: Any = Task.current_task()
        if running is not None:
            self.task, self._initialized_externally = running, True
            return
        arguments = dict(self.init_kwargs)
        arguments.setdefault("project_name", os.environ.get("CLEARML_PROJECT", self.user_provided_run_name))
        arguments.setdefault("task_name", os.environ.get("CLEARML_TASK", self.user_provided_run_name))
        self.task = Task.init(**arguments)

    @property
    def tracker(self) -> Any:
        """The ``clearml.Task`` (None before `start()`)."""
        return self.task

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> Any:
        """Connect `values` to the task as its configuration (``Task.connect_configuration``), which it returns."""
        return self.task.connect_configuration(values)

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers at `step` as scalars (series: see `title_and_series`); without a `step`, as single values.

        Other values are skipped with a warning; `kwargs` go to
        ``Logger.report_scalar`` / ``report_single_value``.
        """
        logger = self.task.get_logger()
        for key, value in values.items():
            value = as_number(value)
            if not isinstance(value, (int, float)):
                if key not in self._skipped:
                    self._skipped.add(key)
                    _log.warning("ClearML skips %s: a scalar is a number, not a %s.", key, type(value).__name__)
                continue
            if step is None:
                logger.report_single_value(name=key, value=value, **kwargs)
            else:
                title, series = title_and_series(key)
                logger.report_scalar(title=title, series=series, value=value, iteration=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Each value is one image (NumPy array or PIL image), reported with ``Logger.report_image``."""
        logger = self.task.get_logger()
        for key, image in values.items():
            title, series = title_and_series(key)
            logger.report_image(title=title, series=series, iteration=step, image=image, **kwargs)

    @on_main_process
    def log_table(self, table_name: str, columns: list[str] | None = None, data: list[list[Any]] | None = None,
                  dataframe: Any = None, step: int | None = None, **kwargs: Any) -> None:
        """A table from a `dataframe`, or from `data` rows (headed by `columns`, else by the first row)."""
        table = dataframe
        if dataframe is None:
            if data is None:
                raise ValueError(f"log_table({table_name!r}) got neither `data` nor `dataframe`; pass the rows as "
                                 "data=[[...], ...] (with columns=[...]) or a pandas dataframe=.")
            table = [columns, *data] if columns else data
        title, series = title_and_series(table_name)
        self.task.get_logger().report_table(title=title, series=series, table_plot=table, iteration=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        """Close the task this tracker started (offline: write the session's zip); the script's own task stays open."""
        if self.task is not None and not self._initialized_externally:
            self.task.close()
