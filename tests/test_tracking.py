"""Logging and experiment trackers, read back with each tracker's own reader."""

from __future__ import annotations

import glob
import json
import logging
import struct
from pathlib import Path

import pytest

from conftest import launch
from hasten import Accelerator
from hasten.logging import get_logger
from hasten.tracking import GeneralTracker, LoggerType


def wandb_records(run_file: str) -> list:
    """The records of an offline wandb run file (a LevelDB-style log of wandb's own protobuf records)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, records, pending = Path(run_file).read_bytes(), 32768, 7, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        payload, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            records.append(payload)
        elif kind in (2, 3):
            pending += payload
        else:
            records.append(pending + payload)
            pending = b""
    parsed = []
    for raw in records:
        record = pb.Record()
        record.ParseFromString(raw)
        parsed.append(record)
    return parsed


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tracked")
    result = launch("mp_tracking.py", str(out), num_processes=2, env={"WANDB_SILENT": "true"})
    return out, result


@pytest.mark.multiprocess
def test_logger_prints_once_every_process_or_in_order(tracked_run):
    _, result = tracked_run
    lines = [line for line in result.stdout.splitlines() if line.startswith(("INFO", "WARNING", "DEBUG"))]
    assert lines.count("INFO before the accelerator") == 1
    assert lines.count("INFO main only") == 1
    assert sorted(line for line in lines if "every process" in line) == ["INFO [rank 0] every process",
                                                                          "INFO [rank 1] every process"]
    assert [line for line in lines if "in order" in line] == ["INFO [rank 0] in order", "INFO [rank 1] in order"]
    assert lines.count("WARNING once") == 1 and not any("too detailed" in line for line in lines)


@pytest.mark.multiprocess
def test_jsonl_and_csv_hold_every_step_from_the_main_process(tracked_run):
    out, _ = tracked_run
    records = [json.loads(line) for line in (out / "tracked" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert [r["loss"] for r in records] == pytest.approx([1, 1 / 2, 1 / 3, 1 / 4])
    assert {r["rank_seen"] for r in records} == {0.0}
    assert json.loads((out / "tracked" / "config.json").read_text()) == {"layers": 3, "lr": 0.01, "optimizer": "adamw"}
    rows = (out / "tracked" / "metrics.csv").read_text().splitlines()
    assert rows[0] == "time,step,name,value" and len(rows) == 1 + 4 * 2


@pytest.mark.multiprocess
def test_tensorboard_event_files_read_back(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _ = tracked_run
    events = EventAccumulator(str(out / "tracked"))
    events.Reload()
    losses = events.Scalars("loss")
    assert [e.step for e in losses] == [0, 1, 2, 3]
    assert [e.value for e in losses] == pytest.approx([1, 1 / 2, 1 / 3, 1 / 4])
    assert [e.value for e in events.Scalars("direct")] == [5.0]


@pytest.mark.multiprocess
def test_mlflow_sqlite_store_reads_back(tracked_run):
    from mlflow.tracking import MlflowClient

    out, _ = tracked_run
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tracked")
    (run,) = client.search_runs([experiment.experiment_id])
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in history] == [0, 1, 2, 3]
    assert [m.value for m in history] == pytest.approx([1, 1 / 2, 1 / 3, 1 / 4])
    assert run.data.params == {"lr": "0.01", "layers": "3", "optimizer": "adamw"}
    assert run.info.status == "FINISHED"


@pytest.mark.multiprocess
def test_offline_wandb_run_reads_back(tracked_run):
    out, _ = tracked_run
    (run_file,) = glob.glob(str(out / "wandb" / "offline-run-*" / "*.wandb"))
    records = wandb_records(run_file)
    history = [{(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    assert [h["_step"] for h in history] == [0, 1, 2, 3]
    assert [h["loss"] for h in history] == pytest.approx([1, 1 / 2, 1 / 3, 1 / 4])
    config = {}
    for r in records:
        if r.WhichOneof("record_type") == "config":
            config.update({item.key: json.loads(item.value_json) for item in r.config.update})
    assert config["lr"] == 0.01 and config["optimizer"] == "adamw"


def test_unknown_trackers_and_missing_packages_are_refused(tmp_path, monkeypatch):
    import hasten.tracking

    with pytest.raises(ValueError, match="unknown tracker 'tensorbord'"):
        Accelerator(cpu=True, log_with="tensorbord", project_dir=tmp_path)
    monkeypatch.setattr(hasten.tracking, "is_installed", lambda module: False)
    with pytest.raises(ImportError, match=r"^log_with='comet_ml' needs the comet_ml package, which is not installed: "
                                          r"pip install comet_ml$"):
        Accelerator(cpu=True, log_with=LoggerType.COMETML)
    with pytest.raises(ValueError, match="Logging with `jsonl` requires a `logging_dir`"):
        Accelerator(cpu=True, log_with="jsonl")
    accelerator = Accelerator(cpu=True, log_with="jsonl", project_dir=tmp_path)
    with pytest.raises(ValueError, match=r"init_kwargs names trackers \['wandb'\] that are not in log_with"):
        accelerator.init_trackers("x", init_kwargs={"wandb": {}})
    with pytest.raises(ValueError, match="no tracker named 'mlflow'"):
        accelerator.get_tracker("mlflow")


def test_all_means_every_installed_tracker(tmp_path, monkeypatch):
    import hasten.tracking

    # the test extra installs every tracker package but aim's (see docs/coming-from-accelerate.md)
    installed = hasten.tracking.is_installed
    monkeypatch.setattr(hasten.tracking, "is_installed", lambda module: module != "aim" and installed(module))
    assert Accelerator(cpu=True, log_with="all", project_dir=tmp_path).log_with == [
        "jsonl", "csv", "tensorboard", "wandb", "comet_ml", "mlflow", "clearml", "dvclive", "swanlab", "trackio"]
    # no directory: no file trackers (aim keeps its runs in the logging directory too)
    monkeypatch.setattr(hasten.tracking, "is_installed", lambda module: True)
    assert Accelerator(cpu=True, log_with="all").log_with == [
        "wandb", "comet_ml", "mlflow", "clearml", "dvclive", "swanlab", "trackio"]


class Recorder(GeneralTracker):
    name = "recorder"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self):
        super().__init__()
        self.calls = []

    @property
    def tracker(self):
        return self.calls

    def store_init_configuration(self, values):
        self.calls.append(("config", values))

    def log(self, values, step=None, **kwargs):
        self.calls.append((step, values, kwargs))

    def finish(self):
        self.calls.append("finished")


def test_a_user_tracker_gets_config_values_kwargs_and_finish():
    recorder = Recorder()
    accelerator = Accelerator(cpu=True, log_with=[recorder])
    accelerator.init_trackers("p", config={"a": 1})
    accelerator.log({"x": 2}, step=5, log_kwargs={"recorder": {"commit": False}})
    assert accelerator.get_tracker("recorder", unwrap=True) is recorder.calls
    accelerator.end_training()
    accelerator.end_training()  # finishes each tracker once; the list stays, as Accelerate's
    assert recorder.calls == [("config", {"a": 1}), (5, {"x": 2}, {"commit": False}), "finished"]
    assert accelerator.trackers == [recorder]
    with pytest.raises(NotImplementedError, match="must set the class attribute `name`"):
        type("Nameless", (GeneralTracker,), {})()


def test_log_level_from_the_environment(monkeypatch):
    monkeypatch.setenv("ACCELERATE_LOG_LEVEL", "error")
    assert get_logger("hasten-test-env").logger.level == logging.ERROR
    monkeypatch.setenv("HASTEN_LOG_LEVEL", "debug")
    assert get_logger("hasten-test-env").logger.level == logging.DEBUG
    with pytest.raises(ValueError, match="log_level='loud' is not a logging level"):
        get_logger("x", log_level="loud")


def test_registered_trackers_start_late(tmp_path):
    from hasten.tracking import LOGGER_TYPE_TO_CLASS, TensorBoardTracker, register_tracker_class

    class Named(Recorder):
        name, requires_logging_directory = "named", True

        def __init__(self, run_name, logging_dir):
            super().__init__()
            self.where = (run_name, logging_dir)

        def start(self):
            self.calls.append("started")

    register_tracker_class(Named)
    try:
        accelerator = Accelerator(cpu=True, log_with="named", project_dir=tmp_path)
        accelerator.init_trackers("p", config={"a": 1})
        tracker = accelerator.get_tracker("named")
        assert tracker.where == ("p", str(tmp_path)) and tracker.calls == ["started", ("config", {"a": 1})]
        with pytest.warns(UserWarning, match="replaces the tracker registered as 'named'"):
            register_tracker_class(Named)
    finally:
        LOGGER_TYPE_TO_CLASS.pop("named")
    with pytest.raises(ValueError, match="set a non-empty class attribute `name`"):
        register_tracker_class(type("Nameless", (GeneralTracker,), {"requires_logging_directory": False}))
    board = TensorBoardTracker("run", tmp_path / "tb")  # created: nothing written until start()
    assert board.writer is None and not (tmp_path / "tb").exists()
