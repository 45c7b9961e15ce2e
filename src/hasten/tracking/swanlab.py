"""SwanLab: ``swanlab.init(project=run_name)``; without an account, ``SWANLAB_MODE=offline`` keeps the run on disk.

Offline, a run is a folder under ``SWANLAB_LOG_DIR`` (default ``./swanlog``)
holding ``run-<id>.swanlab`` (SwanLab's record log: columns, scalars, media),
``files/config.yaml`` and ``media/``; ``swanlab sync`` uploads it later. (SwanLab 0.10's ``local`` mode
also needs its dashboard, ``pip install "swanlab[dashboard]"``.)
"""

from __future__ import annotations

from typing import Any

from .base import GeneralTracker, is_installed, missing_package_error, on_main_process, update_config

__all__ = ["SwanLabTracker"]


class SwanLabTracker(GeneralTracker):
    """``swanlab.init(project=run_name, **kwargs)`` at `start()`; values go to ``run.log`` unchanged.

    As Accelerate does, `start()` records ``FRAMEWORK: "🤗Accelerate"`` in
    the run's config (SwanLab shows the integration's logo from it), so runs
    look the same under either library. `main_process_only` is False, as in
    Accelerate: the Accelerator starts it on the main process only, and a
    script may also start one itself on every process.

    Example:
        >>> from hasten.tracking import SwanLabTracker
        >>> SwanLabTracker.name, SwanLabTracker.requires_logging_directory, SwanLabTracker.main_process_only
        ('swanlab', False, False)

    Offline, as a script would use it::

        os.environ["SWANLAB_MODE"] = "offline"
        accelerator = Accelerator(log_with="swanlab")
        accelerator.init_trackers("my-project", init_kwargs={"swanlab": {"experiment_name": "first"}})
    """

    name = "swanlab"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        if not is_installed("swanlab"):
            raise missing_package_error("swanlab", "swanlab")
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run: Any = None

    @on_main_process
    def start(self) -> None:
        import swanlab  # type: ignore[import-untyped]  # (ships no type information)

        self.run = swanlab.init(project=self.run_name, **self.init_kwargs)
        swanlab.config["FRAMEWORK"] = "🤗Accelerate"  # Accelerate's marker: SwanLab's UI keys its logo on it

    @property
    def tracker(self) -> Any:
        """The ``swanlab`` run (None before `start()`)."""
        return self.run

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Merge `values` into the run's config (later values replace earlier ones)."""
        import swanlab  # type: ignore[import-untyped]

        update_config(swanlab.config, values)

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """``run.log(values, step=step, **kwargs)`` (numbers, or SwanLab's own objects such as ``swanlab.Image``)."""
        self.run.log(values, step=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Each value is a list of images (NumPy arrays or PIL images), logged as ``swanlab.Image``s."""
        import swanlab  # type: ignore[import-untyped]

        for key, images in values.items():
            self.log({key: [swanlab.Image(image) for image in images]}, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        """Finish the run."""
        self.run.finish()
