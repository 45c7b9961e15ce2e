"""The Accelerator's tracker part: `init_trackers`, `log`, `trackers`, `get_tracker`, finishing them (over `hasten.tracking`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..tracking import GeneralTracker
    from ..checkpointing.project import ProjectConfiguration
    from ..runtime.accelerator_state import AcceleratorState

__all__ = ["TrackerPart"]


class TrackerPart:
    """Trackers live on the main process, as in Accelerate: other processes have none, and `log` does nothing there.

    Example:
        >>> from hasten import Accelerator
        >>> Accelerator(cpu=True, log_with="jsonl", project_dir="runs").log_with
        ['jsonl']
    """

    # Shared values this part reads (set once by `Accelerator.__init__`).
    state: AcceleratorState  # who is the main process
    project_configuration: ProjectConfiguration  # where file trackers write (logging_dir)

    def _init_tracking(self, log_with: Any) -> None:
        """Check `log_with` once (names, installed packages, a logging directory where needed); nothing starts yet."""
        self.trackers: list[GeneralTracker] = []
        self.log_with: list[str | GeneralTracker] = []
        self._pending_records: list[tuple[dict[str, Any], int]] = []  # hasten's own records, until trackers start
        self._finished_trackers: list[GeneralTracker] = []  # end_training finishes each once
        if log_with is not None:  # the tracking package is imported only by runs that track (import cost is a feature)
            from ..tracking import resolve_log_with

            self.log_with = resolve_log_with(log_with, self.project_configuration.logging_dir)

    def init_trackers(self, project_name: str, config: dict[str, Any] | None = None,
                      init_kwargs: dict[str, dict[str, Any]] | None = None) -> None:
        """Start every tracker of `log_with` for `project_name` (on the main process) and store `config` as the run's hyper-parameters.

        `init_kwargs` maps a tracker name to keyword arguments for it, e.g.
        ``{"wandb": {"mode": "offline"}}``. Each tracker is created, then
        started (`start()`, trackers passed as instances too), then given `config`.

        Example:
            >>> import tempfile
            >>> from hasten import Accelerator
            >>> accelerator = Accelerator(cpu=True, log_with="jsonl", project_dir=tempfile.mkdtemp())
            >>> accelerator.init_trackers("demo", config={"lr": 0.1})
            >>> accelerator.log({"loss": 0.25}, step=1)
            >>> accelerator.end_training()
        """
        init_kwargs = init_kwargs or {}
        unknown = set(init_kwargs) - {t if isinstance(t, str) else t.name for t in self.log_with}
        if unknown:
            raise ValueError(f"init_kwargs names trackers {sorted(unknown)} that are not in log_with; "
                             "add them to log_with or drop those entries.")
        if not self.state.is_main_process:
            return
        from ..tracking import GeneralTracker, start_tracker

        started: list[GeneralTracker] = []
        for item in self.log_with:
            if isinstance(item, GeneralTracker):
                started.append(item)
            else:
                started.append(start_tracker(item, project_name, self.project_configuration.logging_dir,
                                             dict(init_kwargs.get(item, {}))))
        self.trackers.extend(started)
        for tracker in started:
            tracker.start()
        if config is not None:
            for tracker in started:
                tracker.store_init_configuration(config)
        records, self._pending_records = self._pending_records, []
        for values, step in records:
            self.log(values, step=step)

    def _log_elastic_record(self, values: dict[str, Any], step: int) -> None:
        """Log hasten's record of an event (an elastic re-formation): now, or when the trackers start."""
        if self.trackers:
            self.log(values, step=step)
        elif self.log_with and self.state.is_main_process:
            self._pending_records.append((values, step))

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker called `name` (its backend object with `unwrap=True`); a do-nothing one where none runs."""
        for tracker in self.trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        if self.state.is_main_process and not any((t if isinstance(t, str) else t.name) == name for t in self.log_with):
            raise ValueError(f"no tracker named {name!r}; the trackers are {[t.name for t in self.trackers]}.")
        from ..tracking import GeneralTracker

        return GeneralTracker(_blank=True)  # other processes: calls on it do nothing

    def log(self, values: dict[str, Any], step: int | None = None, log_kwargs: dict[str, dict[str, Any]] | None = None) -> None:
        """Send `values` to every tracker (the main process holds them all; elsewhere this does nothing).

        Example:
            >>> from hasten import Accelerator
            >>> Accelerator(cpu=True).log({"loss": 1.0}, step=0)  # no trackers: nothing happens
        """
        log_kwargs = log_kwargs or {}
        for tracker in self.trackers:
            tracker.log(values, step=step, **log_kwargs.get(tracker.name, {}))

    def _finish_trackers(self) -> None:
        # The list stays, as in Accelerate (scripts read `accelerator.trackers[0].live` after end_training);
        # a second end_training does not finish a tracker twice.
        for tracker in self.trackers:
            if not any(tracker is done for done in self._finished_trackers):
                self._finished_trackers.append(tracker)
                tracker.finish()
