"""Aim: an ``aim.Run`` in the Aim repository at the logging directory (``<logging_dir>/.aim``, created if absent).

``aim up --repo <logging_dir>`` opens the dashboard; ``aim.Repo(path)``
reads the runs back. Aim is not in hasten's test extra: Aim 3.29 requires
``filelock<4``, which would downgrade the filelock the rest of the test set
installs (see docs/coming-from-accelerate.md).
"""

from __future__ import annotations

import os
from typing import Any

from .base import GeneralTracker, as_number, is_installed, missing_package_error, on_main_process

__all__ = ["AimTracker"]


class AimTracker(GeneralTracker):
    """``aim.Run(repo=logging_dir, **kwargs)`` at `start()`, named `run_name`; each value is tracked under its key.

    `kwargs` go to ``aim.Run`` (``experiment=``, ``system_tracking_interval=``,
    ...); a ``repo=`` among them takes the place of `logging_dir`. The config
    is stored as the run's ``"hparams"``.

    Example:
        >>> from hasten.tracking import AimTracker
        >>> AimTracker.name, AimTracker.requires_logging_directory, AimTracker.main_process_only
        ('aim', True, True)

    As a script would use it::

        accelerator = Accelerator(log_with="aim", project_dir="runs")  # the Aim repository: runs/.aim
        accelerator.init_trackers("my-run", init_kwargs={"aim": {"experiment": "baseline"}})
    """

    name = "aim"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str] | None = ".", **kwargs: Any) -> None:
        super().__init__()
        if not is_installed("aim"):
            raise missing_package_error("aim", "aim")
        self.run_name = run_name
        # Accelerate would pass `repo` twice to aim.Run (a TypeError at start); here the explicit one wins
        self.aim_repo_path = kwargs.pop("repo", logging_dir)
        self.init_kwargs = kwargs
        self.writer: Any = None

    @on_main_process
    def start(self) -> None:
        from aim import Run  # type: ignore[import-not-found, import-untyped, unused-ignore]  # not in the test set

        repo = None if self.aim_repo_path is None else os.fspath(self.aim_repo_path)
        self.writer = Run(repo=repo, **self.init_kwargs)
        self.writer.name = self.run_name

    @property
    def tracker(self) -> Any:
        """The ``aim.Run`` (None before `start()`)."""
        return self.writer

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Store `values` as the run's ``"hparams"``."""
        self.writer["hparams"] = values

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """``run.track(value, name=key, step=step, **kwargs)`` per value (`kwargs`: ``epoch``, ``context``)."""
        for key, value in values.items():
            self.writer.track(as_number(value), name=key, step=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict[str, Any], step: int | None = None,
                   kwargs: dict[str, dict[str, Any]] | None = None) -> None:
        """Each value, an image (NumPy array, PIL image) or an ``(image, caption)`` pair, tracked as an ``aim.Image``.

        `kwargs` is Accelerate's dict of two dicts: ``{"aim_image": {...}}``
        for ``aim.Image`` (``format``, ``quality``, ...) and ``{"track": {...}}``
        for ``run.track`` (``context``, ``epoch``).
        """
        import aim  # type: ignore[import-not-found, import-untyped, unused-ignore]

        kwargs = kwargs or {}
        unknown = set(kwargs) - {"aim_image", "track"}
        if unknown:
            raise ValueError(f"AimTracker.log_images got kwargs for {sorted(unknown)}; its kwargs is a dict with the "
                             "keys 'aim_image' (for aim.Image) and 'track' (for run.track).")
        for key, value in values.items():
            image, caption = value if isinstance(value, tuple) else (value, "")
            self.writer.track(aim.Image(image, caption=caption, **kwargs.get("aim_image", {})), name=key, step=step,
                              **kwargs.get("track", {}))

    @on_main_process
    def finish(self) -> None:
        """Close the run."""
        self.writer.close()
