"""MLflow: a run in an experiment; without ``MLFLOW_TRACKING_URI``, a SQLite store in the logging directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .base import GeneralTracker, is_installed, missing_package_error

__all__ = ["MLflowTracker"]

_MAX_PARAMS_PER_BATCH = 100


class MLflowTracker(GeneralTracker):
    """Parameters from the config, numeric values as metrics (strings and others are skipped with a note).

    The tracking store is ``MLFLOW_TRACKING_URI`` if set, else
    ``sqlite:///<logging_dir>/mlflow.db`` (MLflow's plain file store is
    deprecated). ``MLFLOW_EXPERIMENT_NAME`` / ``MLFLOW_RUN_ID`` are honoured.

    Example:
        >>> tracker = MLflowTracker("my-experiment", logging_dir="runs")
        >>> tracker.log({"loss": 0.5}, step=0)
        >>> tracker.finish()
    """

    name = "mlflow"
    requires_logging_directory = False

    def __init__(self, experiment_name: str | None = None, logging_dir: str | os.PathLike[str] | None = None,
                 run_id: str | None = None, tags: dict[str, Any] | str | None = None, nested_run: bool = False,
                 run_name: str | None = None, description: str | None = None) -> None:
        super().__init__()
        if not is_installed("mlflow"):
            raise missing_package_error("mlflow", "mlflow")
        import mlflow

        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name) or "hasten"
        run_id = os.environ.get("MLFLOW_RUN_ID", run_id)
        if not os.environ.get("MLFLOW_TRACKING_URI") and logging_dir is not None:
            Path(logging_dir).mkdir(parents=True, exist_ok=True)
            mlflow.set_tracking_uri(f"sqlite:///{Path(logging_dir).resolve() / 'mlflow.db'}")
        run_tags: dict[str, Any] | None
        if isinstance(tags, str):
            import json

            run_tags = json.loads(tags)
        else:
            run_tags = tags
        experiment = mlflow.get_experiment_by_name(experiment_name)
        experiment_id = experiment.experiment_id if experiment else mlflow.create_experiment(experiment_name, tags=run_tags)
        self.active_run = mlflow.start_run(run_id=run_id, experiment_id=experiment_id, run_name=run_name,
                                           nested=nested_run, tags=run_tags, description=description)
        self._mlflow = mlflow

    @property
    def tracker(self) -> Any:
        return self.active_run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        items = [(k, v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in values.items()]
        for start in range(0, len(items), _MAX_PARAMS_PER_BATCH):
            self._mlflow.log_params(dict(items[start:start + _MAX_PARAMS_PER_BATCH]))

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        metrics = {}
        for name, value in values.items():
            if hasattr(value, "item") and callable(value.item) and getattr(value, "numel", lambda: 1)() == 1:
                value = value.item()
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics[name] = value
        self._mlflow.log_metrics(metrics, step=step, **kwargs)

    def finish(self) -> None:
        self._mlflow.end_run()
