"""Trackio: ``trackio.init(project=run_name)``; local by default, one SQLite database per project under ``TRACKIO_DIR``.

``TRACKIO_DIR`` defaults to ``$HF_HOME/trackio``; ``trackio show`` opens the
dashboard, and ``trackio.Api().runs(project)`` or
``trackio.sqlite_storage.SQLiteStorage.get_logs(project, run)`` read it back.
``space_id=`` (or ``TRACKIO_SPACE_ID``) logs to a Hugging Face Space instead.
"""

from __future__ import annotations

from typing import Any

from .base import GeneralTracker, is_installed, missing_package_error, on_main_process, update_config

__all__ = ["TrackioTracker"]


class TrackioTracker(GeneralTracker):
    """``trackio.init(project=run_name, **kwargs)`` at `start()`; values go to ``run.log`` unchanged.

    `main_process_only` is False, as in Accelerate: the Accelerator starts it
    on the main process only, and a script may also start one itself on
    every process. The config is merged into the run's config, which Trackio
    stores with the first values logged after it.

    Example:
        >>> from hasten.tracking import TrackioTracker
        >>> TrackioTracker.name, TrackioTracker.requires_logging_directory, TrackioTracker.main_process_only
        ('trackio', False, False)

    As a script would use it::

        accelerator = Accelerator(log_with="trackio")
        accelerator.init_trackers("my-project", config={"lr": 0.01}, init_kwargs={"trackio": {"name": "first"}})
    """

    name = "trackio"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        if not is_installed("trackio"):
            raise missing_package_error("trackio", "trackio")
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run: Any = None

    @on_main_process
    def start(self) -> None:
        import trackio

        self.run = trackio.init(project=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        """The ``trackio`` run (None before `start()`)."""
        return self.run

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Merge `values` into the run's config (later values replace earlier ones)."""
        update_config(self.run.config, values)

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """``run.log(values, step=step, **kwargs)``."""
        self.run.log(values, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        """Finish the run (Trackio writes what is still queued)."""
        self.run.finish()
