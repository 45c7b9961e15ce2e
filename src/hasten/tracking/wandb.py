"""Weights & Biases (works offline with ``WANDB_MODE=offline``: run files under ``WANDB_DIR/wandb``)."""

from __future__ import annotations

from typing import Any, cast

from .base import GeneralTracker, is_installed, missing_package_error, on_main_process

__all__ = ["WandBTracker"]


class WandBTracker(GeneralTracker):
    """``wandb.init(project=run_name, **kwargs)`` at `start()`; the config goes to the run's config.

    `main_process_only` is False, as in Accelerate: the Accelerator starts
    it on the main process only, and a script may also start one itself on
    every process.

    Example:
        >>> tracker = WandBTracker("my-project", mode="offline")
        >>> tracker.start()
        >>> tracker.log({"loss": 0.5}, step=0)
        >>> tracker.finish()
    """

    name = "wandb"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        if not is_installed("wandb"):
            raise missing_package_error("wandb", "wandb")
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run: Any = None

    @on_main_process
    def start(self) -> None:
        import wandb

        self.run = wandb.init(project=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.run.config.update(values, allow_val_change=True)

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """``run.log(values, step=step, **kwargs)``."""
        self.run.log(values, step=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Each value is a list of images (NumPy arrays or PIL images), logged as ``wandb.Image``s."""
        import wandb

        for name, images in values.items():
            self.log({name: [wandb.Image(image) for image in images]}, step=step, **kwargs)

    @on_main_process
    def log_table(self, table_name: str, columns: list[str] | None = None, data: list[list[Any]] | None = None,
                  dataframe: Any = None, step: int | None = None, **kwargs: Any) -> None:
        """A ``wandb.Table`` from `columns` and `data`, or from a `dataframe`."""
        import wandb

        table = wandb.Table(columns=cast(Any, columns), data=data, dataframe=dataframe)  # wandb types columns narrowly
        self.log({table_name: table}, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        self.run.finish()
