"""Weights & Biases (works offline with ``WANDB_MODE=offline``: run files under ``WANDB_DIR/wandb``)."""

from __future__ import annotations

from typing import Any

from .base import GeneralTracker, is_installed, missing_package_error

__all__ = ["WandBTracker"]


class WandBTracker(GeneralTracker):
    """``wandb.init(project=run_name, **kwargs)``; the config goes to ``run.config``.

    Example:
        >>> tracker = WandBTracker("my-project", mode="offline")
        >>> tracker.log({"loss": 0.5}, step=0)
        >>> tracker.finish()
    """

    name = "wandb"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        if not is_installed("wandb"):
            raise missing_package_error("wandb", "wandb")
        import wandb

        self.run = wandb.init(project=run_name, **kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.run.config.update(values, allow_val_change=True)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.run.log(values, step=step, **kwargs)

    def finish(self) -> None:
        self.run.finish()
