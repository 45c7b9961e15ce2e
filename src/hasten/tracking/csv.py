"""A dependency-free tracker for spreadsheets: ``<logging_dir>/<run>/metrics.csv`` (long format: step, name, value)."""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path
from typing import Any

from .base import GeneralTracker, on_main_process
from .jsonl import _plain

__all__ = ["CSVTracker"]


class CSVTracker(GeneralTracker):
    """One row per value: ``time,step,name,value`` (so new metric names never change the header).

    Example:
        >>> import tempfile
        >>> tracker = CSVTracker("run", tempfile.mkdtemp())
        >>> tracker.start()
        >>> tracker.log({"loss": 0.5, "eval": {"acc": 0.9}}, step=3); tracker.finish()
    """

    name = "csv"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__()
        self.directory = Path(logging_dir) / run_name
        self.path = self.directory / "metrics.csv"
        self._file: Any = None
        self._writer: Any = None

    @on_main_process
    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        self._file = open(self.path, "a", newline="", buffering=1)
        self._writer = csv.writer(self._file)
        if new:
            self._writer.writerow(["time", "step", "name", "value"])

    @property
    def tracker(self) -> Any:
        return self._writer

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        now = time.time()
        for name, value in _flatten(_plain(values)):
            self._writer.writerow([now, "" if step is None else step, name, value])

    @on_main_process
    def finish(self) -> None:
        self._file.close()


def _flatten(values: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    rows = []
    for key, value in values.items():
        if isinstance(value, dict):
            rows += _flatten(value, f"{prefix}{key}/")
        else:
            rows.append((f"{prefix}{key}", value))
    return rows
