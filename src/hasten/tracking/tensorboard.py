"""TensorBoard: ``torch.utils.tensorboard`` (needs the tensorboard package), else ``tensorboardX``."""

from __future__ import annotations

import os
from typing import Any

from .base import GeneralTracker, is_installed, missing_package_error

__all__ = ["TensorBoardTracker"]


def _summary_writer() -> Any:
    if is_installed("tensorboard"):
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter
    if is_installed("tensorboardX"):
        from tensorboardX import SummaryWriter as WriterX

        return WriterX
    raise missing_package_error("tensorboard", "tensorboard")


class TensorBoardTracker(GeneralTracker):
    """Event files under ``<logging_dir>/<run_name>``; scalars, text, and the config as hparams.

    Example:
        >>> tracker = TensorBoardTracker("run", "runs")
        >>> tracker.log({"loss": 0.5}, step=0)
        >>> tracker.finish()
    """

    name = "tensorboard"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__()
        self.logging_dir = os.path.join(os.fspath(logging_dir), run_name)
        self.writer = _summary_writer()(self.logging_dir, **kwargs)

    @property
    def tracker(self) -> Any:
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        hparams = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in values.items()}
        self.writer.add_hparams(hparams, metric_dict={}, run_name=".")
        self.writer.flush()

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        for name, value in values.items():
            if hasattr(value, "item") and callable(value.item) and getattr(value, "numel", lambda: 1)() == 1:
                value = value.item()
            if isinstance(value, (int, float)):
                self.writer.add_scalar(name, value, global_step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.add_text(name, value, global_step=step, **kwargs)
            elif isinstance(value, dict):
                self.writer.add_scalars(name, value, global_step=step, **kwargs)
            else:
                raise TypeError(f"TensorBoard cannot log {name}={type(value).__name__}; log numbers, strings or dicts of numbers.")
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()
