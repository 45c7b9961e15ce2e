"""TensorBoard: ``torch.utils.tensorboard`` (needs the tensorboard package), else ``tensorboardX``."""

from __future__ import annotations

import logging
import os
from typing import Any

from .base import GeneralTracker, as_number, is_installed, missing_package_error, on_main_process

__all__ = ["TensorBoardTracker"]

_log = logging.getLogger(__name__)


def _summary_writer() -> Any:
    if is_installed("tensorboard"):
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter
    if is_installed("tensorboardX"):
        from tensorboardX import SummaryWriter as WriterX

        return WriterX
    raise missing_package_error("tensorboard", "tensorboard")


class TensorBoardTracker(GeneralTracker):
    """Event files under ``<logging_dir>/<run_name>``; scalars, text, dicts of scalars, images, the config as hparams.

    `kwargs` go to the ``SummaryWriter``, which `start()` opens (on the main process).

    Example:
        >>> import tempfile
        >>> tracker = TensorBoardTracker("run", tempfile.mkdtemp())
        >>> tracker.start()
        >>> tracker.log({"loss": 0.5}, step=0)
        >>> tracker.finish()
    """

    name = "tensorboard"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.logging_dir_param = logging_dir
        self.logging_dir = os.path.join(os.fspath(logging_dir), run_name)
        self.init_kwargs = kwargs
        self.writer: Any = None
        self._skipped: set[str] = set()  # names already warned about

    @on_main_process
    def start(self) -> None:
        self.writer = _summary_writer()(self.logging_dir, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.writer

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        hparams = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in values.items()}
        self.writer.add_hparams(hparams, metric_dict={}, run_name=".")
        self.writer.flush()

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers become scalars, strings text, dicts of numbers grouped scalars; other values are skipped."""
        for name, value in values.items():
            value = as_number(value)
            if isinstance(value, (int, float)):
                self.writer.add_scalar(name, value, global_step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.add_text(name, value, global_step=step, **kwargs)
            elif isinstance(value, dict):
                self.writer.add_scalars(name, {k: as_number(v) for k, v in value.items()}, global_step=step, **kwargs)
            elif name not in self._skipped:  # as Accelerate: skipped, the other values still go in
                self._skipped.add(name)
                _log.warning("TensorBoard skips %s: a %s is not a number, a string or a dict of numbers.",
                             name, type(value).__name__)
        self.writer.flush()

    @on_main_process
    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Each value is a batch of images (``SummaryWriter.add_images``; `kwargs` such as ``dataformats``)."""
        for name, images in values.items():
            self.writer.add_images(name, images, global_step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        self.writer.close()
