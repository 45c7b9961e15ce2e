"""DVCLive: plain files in a folder (default ``dvclive/``): ``params.yaml``, ``metrics.json``, ``plots/metrics/*.tsv``.

DVCLive's own readers read them back: ``dvclive.serialize.load_yaml(live.params_file)``
and ``dvclive.utils.parse_metrics(live)``.
"""

from __future__ import annotations

import logging
from typing import Any

from .base import GeneralTracker, as_number, is_installed, missing_package_error, on_main_process

__all__ = ["DVCLiveTracker"]

_log = logging.getLogger(__name__)


class DVCLiveTracker(GeneralTracker):
    """``dvclive.Live(**kwargs)`` at `start()`, or the `live` object given; every `log` call is one DVCLive step.

    DVCLive has no run name: `run_name` (the project name `init_trackers`
    passes) is kept as ``self.run_name`` and not sent to DVCLive, as in
    Accelerate; name the folder and experiment with ``dir=`` and
    ``exp_name=`` in `kwargs`. `log` sets DVCLive's step to `step` when given,
    then moves to the next step, so calls without a step count on from there.

    Example:
        >>> from hasten.tracking import DVCLiveTracker
        >>> DVCLiveTracker.name, DVCLiveTracker.requires_logging_directory, DVCLiveTracker.main_process_only
        ('dvclive', False, True)

    As a script would use it::

        accelerator = Accelerator(log_with="dvclive")
        accelerator.init_trackers("my-project", init_kwargs={"dvclive": {"dir": "runs/dvclive"}})
    """

    name = "dvclive"
    requires_logging_directory = False

    def __init__(self, run_name: str | None = None, live: Any = None, **kwargs: Any) -> None:
        super().__init__()
        if live is None and not is_installed("dvclive"):
            raise missing_package_error("dvclive", "dvclive")
        self.run_name = run_name
        self.live = live
        self.init_kwargs = kwargs
        self._skipped: set[str] = set()  # names already warned about

    @on_main_process
    def start(self) -> None:
        if self.live is None:
            from dvclive import Live

            self.live = Live(**self.init_kwargs)

    @property
    def tracker(self) -> Any:
        """The ``dvclive.Live`` object (None before `start()` unless one was given)."""
        return self.live

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Write `values` to DVCLive's ``params.yaml`` (``Live.log_params``)."""
        self.live.log_params(values)

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Each value DVCLive can log (numbers, strings, NumPy scalars) via ``Live.log_metric``; then the next step."""
        from dvclive.plots import Metric

        if step is not None:
            self.live.step = step
        for key, value in values.items():
            value = as_number(value)
            if Metric.could_log(value):
                self.live.log_metric(key, value, **kwargs)
            elif key not in self._skipped:
                self._skipped.add(key)
                _log.warning("DVCLive skips %s: a metric is a number or a string, not a %s.",
                             key, type(value).__name__)
        self.live.next_step()

    @on_main_process
    def finish(self) -> None:
        """End the DVCLive run (``Live.end``: the summary, and the DVC experiment when it saves one)."""
        self.live.end()
