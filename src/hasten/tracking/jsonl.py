"""A dependency-free tracker: one JSON object per `log` call in ``<logging_dir>/<run>/metrics.jsonl``."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from .base import GeneralTracker, on_main_process

__all__ = ["JSONLinesTracker"]


def _plain(value: Any) -> Any:
    """Numbers, strings and nested dicts as JSON can hold them (tensors and numpy scalars become numbers)."""
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return str(value)


class JSONLinesTracker(GeneralTracker):
    """Append ``{"step": ..., "time": ..., **values}`` lines; the config goes to ``config.json``.

    Example:
        >>> import tempfile
        >>> tracker = JSONLinesTracker("run", tempfile.mkdtemp())
        >>> tracker.start()
        >>> tracker.log({"loss": 0.5}, step=1); tracker.finish()
    """

    name = "jsonl"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__()
        self.directory = Path(logging_dir) / run_name
        self.path = self.directory / "metrics.jsonl"
        self._file: Any = None

    @on_main_process
    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", buffering=1)  # line-buffered: each record reaches the file at once

    @property
    def tracker(self) -> Any:
        return self._file

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        (self.directory / "config.json").write_text(json.dumps(_plain(values), indent=2, sort_keys=True))

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        record = {"step": step, "time": time.time(), **_plain(values)}
        self._file.write(json.dumps(record) + "\n")

    @on_main_process
    def finish(self) -> None:
        self._file.close()
