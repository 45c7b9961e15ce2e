"""MLflow: a run in an experiment; without a tracking URI set, a SQLite store in the logging directory."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from ..core.environment import str_to_bool
from .base import GeneralTracker, is_installed, missing_package_error, on_main_process

__all__ = ["MLflowTracker"]

_log = logging.getLogger(__name__)


def _uri_chosen(mlflow: Any) -> bool:
    """Whether the user chose a tracking store (``MLFLOW_TRACKING_URI`` or ``mlflow.set_tracking_uri``)."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return True
    try:
        from mlflow.tracking._tracking_service.utils import is_tracking_uri_set
    except ImportError:  # an MLflow without the helper: only the variable says it
        return False
    return bool(is_tracking_uri_set())


class MLflowTracker(GeneralTracker):
    """Parameters from the config, numeric values as metrics (strings and others are skipped with a note).

    The tracking store is the one the user chose (``MLFLOW_TRACKING_URI`` or
    ``mlflow.set_tracking_uri``), else ``sqlite:///<logging_dir>/mlflow.db``
    (MLflow's plain file store is deprecated); a new experiment keeps its
    artifacts in `logging_dir`. ``MLFLOW_EXPERIMENT_NAME``, ``MLFLOW_RUN_ID``,
    ``MLFLOW_TAGS`` (JSON) and ``MLFLOW_NESTED_RUN`` take precedence over the
    arguments, as in Accelerate. The run starts at `start()`.

    Example:
        >>> import tempfile
        >>> tracker = MLflowTracker("my-experiment", logging_dir=tempfile.mkdtemp())
        >>> tracker.start()
        >>> tracker.log({"loss": 0.5}, step=0)
        >>> tracker.finish()
    """

    name = "mlflow"
    requires_logging_directory = False

    def __init__(self, experiment_name: str | None = None, logging_dir: str | os.PathLike[str] | None = None,
                 run_id: str | None = None, tags: dict[str, Any] | str | None = None, nested_run: bool | None = False,
                 run_name: str | None = None, description: str | None = None) -> None:
        super().__init__()
        if not is_installed("mlflow"):
            raise missing_package_error("mlflow", "mlflow")
        self.experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name) or "hasten"
        self.run_id = os.environ.get("MLFLOW_RUN_ID", run_id)
        chosen_tags = os.environ.get("MLFLOW_TAGS", tags)
        self.tags: dict[str, Any] | None = json.loads(chosen_tags) if isinstance(chosen_tags, str) else chosen_tags
        nested = os.environ.get("MLFLOW_NESTED_RUN", nested_run)
        self.nested_run = bool(str_to_bool(nested)) if isinstance(nested, str) else bool(nested)
        self.logging_dir = None if logging_dir is None else os.fspath(logging_dir)
        self.run_name = run_name
        self.description = description
        self.active_run: Any = None
        self._skipped: set[str] = set()  # metric names already warned about

    @on_main_process
    def start(self) -> None:
        import mlflow

        if self.logging_dir is not None and not _uri_chosen(mlflow):
            Path(self.logging_dir).mkdir(parents=True, exist_ok=True)
            mlflow.set_tracking_uri(f"sqlite:///{Path(self.logging_dir).resolve() / 'mlflow.db'}")
        experiment = mlflow.get_experiment_by_name(self.experiment_name)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            experiment_id = mlflow.create_experiment(self.experiment_name, artifact_location=self.logging_dir,
                                                     tags=self.tags)
        self.active_run = mlflow.start_run(run_id=self.run_id, experiment_id=experiment_id, run_name=self.run_name,
                                           nested=self.nested_run, tags=self.tags, description=self.description)

    @property
    def tracker(self) -> Any:
        return self.active_run

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Log `values` as parameters; one longer than MLflow accepts is left out with a warning (`values` is not changed)."""
        import mlflow
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        items = []
        for key, value in values.items():
            if len(str(value)) > MAX_PARAM_VAL_LENGTH:  # MLflow stores every parameter as its str()
                _log.warning("MLflow skips the parameter %s: its value is longer than the %d characters MLflow "
                             "accepts.", key, MAX_PARAM_VAL_LENGTH)
                continue
            items.append((key, value if isinstance(value, (int, float, str, bool)) else str(value)))
        for start in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
            mlflow.log_params(dict(items[start:start + MAX_PARAMS_TAGS_PER_BATCH]))

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers (and one-element tensors) as metrics; `kwargs` go to ``mlflow.log_metrics`` (e.g. ``synchronous``)."""
        import mlflow

        metrics = {}
        for key, value in values.items():
            if hasattr(value, "item") and callable(value.item) and getattr(value, "numel", lambda: 1)() == 1:
                value = value.item()
            if isinstance(value, (int, float)):
                metrics[key] = value
            elif key not in self._skipped:
                self._skipped.add(key)
                _log.warning("MLflow skips the metric %s: a metric is a number, not a %s.", key, type(value).__name__)
        mlflow.log_metrics(metrics, step=step, **kwargs)

    @on_main_process
    def log_figure(self, figure: Any, artifact_file: str, **save_kwargs: Any) -> None:
        """Save a matplotlib or plotly `figure` as the run's artifact `artifact_file` (``mlflow.log_figure``)."""
        import mlflow

        mlflow.log_figure(figure=figure, artifact_file=artifact_file, **save_kwargs)

    @on_main_process
    def log_artifacts(self, local_dir: str, artifact_path: str | None = None) -> None:
        """Copy everything in `local_dir` into the run's artifacts (under `artifact_path` if given)."""
        import mlflow

        mlflow.log_artifacts(local_dir=local_dir, artifact_path=artifact_path)

    @on_main_process
    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        """Copy the file `local_path` into the run's artifacts (under `artifact_path` if given)."""
        import mlflow

        mlflow.log_artifact(local_path=local_path, artifact_path=artifact_path)

    @on_main_process
    def finish(self) -> None:
        import mlflow

        mlflow.end_run()
