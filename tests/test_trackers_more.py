"""Comet, ClearML, DVCLive, SwanLab, Trackio, Aim: each runs offline or locally; its own reader reads its files back.

A backend that starts threads or a service process (Comet, ClearML, SwanLab, Trackio) runs in an interpreter of
its own, so that what it leaves behind is not inherited by later tests' forks, and its process-wide settings
(ClearML's offline switch, Trackio's folder, read at import) start fresh. Aim is not in the test extra (see
docs/coming-from-accelerate.md): its tracker is checked against a stand-in package with Aim's documented API.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from conftest import run_with_timeout
from hasten import Accelerator
from hasten.tracking import LOGGER_TYPE_TO_CLASS


def needs(package: str):
    return pytest.mark.skipif(importlib.util.find_spec(package) is None, reason=f"needs {package} (test extra)")


def run_alone(tmp_path: Path, body: str, env: dict[str, str] | None = None, timeout: float = 240) -> dict:
    """Run `body` (Python; `out` is the folder, `result` a dict to fill) in a fresh interpreter; return `result`."""
    script = tmp_path / "scenario.py"
    script.write_text("import json, os, sys\nfrom pathlib import Path\nout = Path(sys.argv[1])\nresult = {}\n"
                      + textwrap.dedent(body) + "\n(out / 'result.json').write_text(json.dumps(result))\n")
    run_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    done = run_with_timeout([sys.executable, str(script), str(tmp_path)], timeout, run_env)
    assert done.returncode == 0, f"the scenario failed:\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return json.loads((tmp_path / "result.json").read_text())


# -- Comet ------------------------------------------------------------------------------------------------------------
@needs("comet_ml")
def test_comet_offline_archive_holds_parameters_metrics_and_others(tmp_path):
    result = run_alone(tmp_path, """
        import comet_ml, torch
        from hasten import Accelerator

        accelerator = Accelerator(cpu=True, log_with="comet_ml")
        accelerator.init_trackers("hasten-comet", config={"lr": 0.01, "layers": 3, "optimizer": "adamw"},
                                  init_kwargs={"comet_ml": {"online": False, "experiment_config":
                                               comet_ml.ExperimentConfig(offline_directory=str(out / "comet"))}})
        result["unwrapped"] = type(accelerator.get_tracker("comet_ml", unwrap=True)).__name__
        for step in range(3):
            accelerator.log({"loss": torch.tensor(1 / (step + 1)), "phase": "train",
                             "parts": {"a": step, "b": 2 * step}}, step=step)
        accelerator.end_training()
    """)
    assert result["unwrapped"] == "OfflineExperiment"
    (archive,) = (tmp_path / "comet").glob("*.zip")
    with zipfile.ZipFile(archive) as zipped:
        messages = [json.loads(line) for line in zipped.read("messages.json").decode().splitlines() if line]
    payloads = [m["payload"] for m in messages]
    params = {p["param"]["paramName"]: p["param"]["paramValue"] for p in payloads if "param" in p}
    assert {k: params[k] for k in ("lr", "layers", "optimizer")} == {"lr": 0.01, "layers": 3, "optimizer": "adamw"}
    metrics = [p["metric"] for p in payloads if "metric" in p]
    losses = [(m["step"], m["metricValue"]) for m in metrics if m["metricName"] == "loss"]
    assert losses == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))]  # a one-element tensor is a number
    assert [(m["step"], m["metricValue"]) for m in metrics if m["metricName"] == "b"] == [(0, 0), (1, 2), (2, 4)]
    others = [m["payload"]["value"] for m in messages if m["type"] == "log_other" and m["payload"]["key"] == "phase"]
    assert others == ["train"] * 3


# -- ClearML ----------------------------------------------------------------------------------------------------------
CLEARML_RUN = textwrap.dedent("""
    import numpy as np
    from clearml import Task
    from clearml.config import get_offline_dir
    from hasten import Accelerator

    Task.set_offline(True)
    {before}
    accelerator = Accelerator(cpu=True, log_with="clearml")
    accelerator.init_trackers("hasten-clearml", config={{"lr": 0.01, "layers": 3, "optimizer": "adamw"}},
                              init_kwargs={{"clearml": {{"tags": ["hasten"]}}}})
    task = accelerator.get_tracker("clearml", unwrap=True)
    result["same_task"] = task is Task.current_task()
    result["offline_dir"] = str(get_offline_dir(task_id=task.id))
    tracker = accelerator.get_tracker("clearml")
    accelerator.log({{"loss": 0.5, "eval_loss": 0.75, "test_accuracy": 0.25, "note": "text"}}, step=3)
    accelerator.log({{"final_loss": 0.125}})
    tracker.log_images({{"eval_picture": np.eye(16, dtype=np.uint8) * 255}}, step=3)
    tracker.log_table("rows", columns=["a", "b"], data=[[1, 2], [3, 4]], step=3)
    try:
        tracker.log_table("empty")
    except ValueError as error:
        result["empty_table"] = str(error)
    accelerator.end_training()
    result["open_after_end"] = Task.current_task() is not None
    {after}
""")


def clearml_env(tmp_path: Path) -> dict[str, str]:
    """Offline sessions under `tmp_path`; reports sent from threads, not from ClearML's forked process.

    That process is forked while another thread of ``Task.init`` starts ``git status``; it can inherit the
    child's exec-status pipe and hold it, and ``Task.init`` then waits for good (seen here, now and then).
    """
    (tmp_path / "clearml.conf").write_text("sdk.development.report_use_subprocess: false\n")
    return {"CLEARML_CACHE_DIR": str(tmp_path), "CLEARML_CONFIG_FILE": str(tmp_path / "clearml.conf")}


@needs("clearml")
def test_clearml_offline_session_holds_config_scalars_images_and_tables(tmp_path):
    result = run_alone(tmp_path, CLEARML_RUN.format(before="", after=""), env=clearml_env(tmp_path))
    session = Path(result["offline_dir"])
    from clearml.utilities.config import text_to_config_dict

    task = json.loads((session / "task.json").read_text())
    assert text_to_config_dict(task["configuration"]["General"]["value"]) == {"lr": 0.01, "layers": 3,
                                                                              "optimizer": "adamw"}
    assert task["tags"] == ["hasten"]  # init_kwargs reach Task.init
    events = [e for line in (session / "metrics.jsonl").read_text().splitlines() for e in json.loads(line)]
    scalars = {(e["metric"], e["variant"]): (e["iter"], e["value"]) for e in events
               if e["type"] == "training_stats_scalar" and e["metric"] != "Summary"}
    assert scalars == {("loss", "train"): (3, 0.5), ("loss", "eval"): (3, 0.75), ("accuracy", "test"): (3, 0.25)}
    singles = {e["variant"]: e["value"] for e in events if e.get("metric") == "Summary"}
    assert singles == {"final_loss": 0.125}  # no step: a single value; the string was skipped
    (table,) = [e for e in events if e.get("metric") == "rows"]
    plot = json.loads(table["plot_str"])["data"][0]
    assert plot["header"]["values"] == ["a", "b"] and plot["cells"]["values"] == [[1, 3], [2, 4]]
    assert len(list((session / "data").rglob("*.jpeg"))) == 1
    assert result["same_task"] and not result["open_after_end"]
    assert result["empty_table"].startswith("log_table('empty') got neither `data` nor `dataframe`")


@needs("clearml")
def test_clearml_task_started_by_the_script_is_used_and_left_open(tmp_path):
    result = run_alone(tmp_path, CLEARML_RUN.format(
        before='mine = Task.init(project_name="own", task_name="own")',
        after='result["mine"] = mine.id\nresult["project"] = mine.get_project_name()\nmine.close()'),
        env=clearml_env(tmp_path))
    assert Path(result["offline_dir"]).name == result["mine"] and result["project"] == "own"
    assert result["open_after_end"]  # end_training left the script's task to the script


# -- DVCLive ----------------------------------------------------------------------------------------------------------
@needs("dvclive")
def test_dvclive_files_hold_params_and_every_step(tmp_path, monkeypatch, caplog):
    import torch
    from dvclive.plots import Metric
    from dvclive.serialize import load_yaml
    from dvclive.utils import parse_metrics

    monkeypatch.chdir(tmp_path)  # no DVC or git repository around: DVCLive writes plain files
    accelerator = Accelerator(cpu=True, log_with="dvclive")
    accelerator.init_trackers("hasten-dvclive", config={"lr": 0.01, "layers": 3},
                              init_kwargs={"dvclive": {"dir": str(tmp_path / "live"), "save_dvc_exp": False,
                                                       "dvcyaml": None}})
    tracker = accelerator.get_tracker("dvclive")
    assert tracker.run_name == "hasten-dvclive" and accelerator.get_tracker("dvclive", unwrap=True) is tracker.live
    with caplog.at_level(logging.WARNING, logger="hasten.tracking.dvclive"):
        accelerator.log({"loss": 1.0, "phase": "train"})  # step 0
        accelerator.log({"loss": torch.tensor(0.5), "shape": [1, 2]})  # step 1; a list is no metric
        accelerator.log({"loss": 0.25}, step=5)
        accelerator.log({"loss": 0.125, "shape": [3]})  # counts on from 5: step 6, warned once
    accelerator.end_training()
    assert [r.getMessage() for r in caplog.records] == ["DVCLive skips shape: a metric is a number or a string, "
                                                        "not a list."]
    live = tracker.live
    assert load_yaml(live.params_file) == {"lr": 0.01, "layers": 3}
    history, latest = parse_metrics(live)
    loss = history[os.path.join(live.plots_dir, Metric.subfolder, "loss.tsv")]
    assert [(int(row["step"]), float(row["loss"])) for row in loss] == [(0, 1.0), (1, 0.5), (5, 0.25), (6, 0.125)]
    assert latest["step"] == 6 and latest["phase"] == "train"


# -- SwanLab ----------------------------------------------------------------------------------------------------------
@needs("swanlab")
def test_swanlab_offline_run_holds_config_scalars_and_images(tmp_path):
    result = run_alone(tmp_path, """
        import numpy as np
        from hasten import Accelerator

        accelerator = Accelerator(cpu=True, log_with="swanlab")
        accelerator.init_trackers("hasten-swanlab", config={"lr": 0.01, "layers": 3},
                                  init_kwargs={"swanlab": {"experiment_name": "first", "description": "a test"}})
        result["unwrapped"] = type(accelerator.get_tracker("swanlab", unwrap=True)).__name__
        for step in range(1, 4):
            accelerator.log({"loss": 1 / step}, step=step)
        accelerator.get_tracker("swanlab").log_images({"samples": [np.zeros((8, 8, 3), dtype=np.uint8)] * 2}, step=3)
        accelerator.end_training()
    """, env={"SWANLAB_MODE": "offline", "SWANLAB_LOG_DIR": str(tmp_path / "swanlog")})
    import yaml
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    assert result["unwrapped"] == "Run"
    (run_dir,) = (tmp_path / "swanlog").glob("run-*")
    reader = DataStoreReader()
    reader.open(next(run_dir.glob("run-*.swanlab")))
    records = []
    for raw in reader:
        record = Record()
        record.ParseFromString(raw)
        records.append(record)
    reader.close()
    (start,) = [r.start for r in records if r.HasField("start")]
    assert (start.project, start.name, start.description) == ("hasten-swanlab", "first", "a test")
    scalars = [(r.scalar.step, r.scalar.value.number) for r in records
               if r.HasField("scalar") and r.scalar.key == "loss"]
    assert scalars == [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))]
    (media,) = [r.media for r in records if r.HasField("media")]
    assert media.key == "samples" and media.step == 3 and len(media.value.items) == 2
    assert [r.finish.state for r in records if r.HasField("finish")] == [1]  # RUN_STATE_FINISHED
    config = {k: v["value"] for k, v in yaml.safe_load((run_dir / "files" / "config.yaml").read_text()).items()}
    assert config == {"FRAMEWORK": "🤗Accelerate", "lr": 0.01, "layers": 3}  # Accelerate's marker, nothing else


# -- Trackio ----------------------------------------------------------------------------------------------------------
@needs("trackio")
def test_trackio_local_database_holds_config_and_metrics(tmp_path):
    result = run_alone(tmp_path, """
        from hasten import Accelerator

        accelerator = Accelerator(cpu=True, log_with="trackio")
        accelerator.init_trackers("hasten-trackio", config={"lr": 0.01, "layers": 3},
                                  init_kwargs={"trackio": {"name": "first"}})
        result["unwrapped"] = type(accelerator.get_tracker("trackio", unwrap=True)).__name__
        for step in range(3):
            accelerator.log({"loss": 1 / (step + 1)}, step=step)
        accelerator.end_training()

        import trackio
        from trackio.sqlite_storage import SQLiteStorage

        result["runs"] = [run.name for run in trackio.Api().runs("hasten-trackio")]
        result["logs"] = [{k: v for k, v in row.items() if k in ("step", "loss")}
                          for row in SQLiteStorage.get_logs("hasten-trackio", "first")]
        result["config"] = SQLiteStorage.get_run_config("hasten-trackio", "first")
    """, env={"TRACKIO_DIR": str(tmp_path / "trackio"), "HF_HUB_OFFLINE": "1"})
    assert result["unwrapped"] == "Run" and result["runs"] == ["first"]
    assert [(row["step"], row["loss"]) for row in result["logs"]] == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))]
    assert {k: v for k, v in result["config"].items() if not k.startswith("_")} == {"lr": 0.01, "layers": 3}


# -- creating a tracker starts nothing --------------------------------------------------------------------------------
def test_creating_the_trackers_imports_no_backend(tmp_path):
    present = [name for name in ("comet_ml", "clearml", "dvclive", "swanlab", "trackio")
               if importlib.util.find_spec(name) is not None]
    result = run_alone(tmp_path, f"""
        from hasten import Accelerator
        from hasten.tracking import LOGGER_TYPE_TO_CLASS

        present = {present!r}
        trackers = [LOGGER_TYPE_TO_CLASS[name]("run") for name in present]
        accelerator = Accelerator(cpu=True, log_with=trackers)
        result["imported"] = sorted(name for name in present if name in sys.modules)
        result["objects"] = [tracker.tracker for tracker in trackers]
    """)
    assert result == {"imported": [], "objects": [None] * len(present)}


# -- Aim: a stand-in package with Aim's documented API ----------------------------------------------------------------
AIM_STAND_IN = '''
"""A stand-in for Aim: records what the tracker calls (aim.Run, run.name, run[...], run.track, aim.Image, close)."""
calls = []


class Image:
    def __init__(self, image, caption="", format="png", quality=90, optimize=False):
        self.image, self.caption, self.format = image, caption, format


class Run:
    def __init__(self, run_hash=None, *, repo=None, read_only=False, experiment=None, force_resume=False,
                 system_tracking_interval=10, log_system_params=False, capture_terminal_logs=True):
        calls.append(("Run", repo, experiment))

    def __setattr__(self, name, value):
        calls.append(("set", name, value))

    def __setitem__(self, key, value):
        calls.append(("item", key, value))

    def track(self, value, name=None, step=None, epoch=None, *, context=None):
        if isinstance(value, Image):
            value = ("Image", value.caption, value.format)
        calls.append(("track", value, name, step, epoch, context))

    def close(self):
        calls.append(("close",))
'''


@pytest.fixture
def aim_stand_in(tmp_path, monkeypatch):
    if importlib.util.find_spec("aim") is not None and "aim" not in sys.modules:
        pytest.skip("a real aim is installed: the stand-in would hide it")
    (tmp_path / "standin" / "aim").mkdir(parents=True)
    (tmp_path / "standin" / "aim" / "__init__.py").write_text(AIM_STAND_IN)
    monkeypatch.syspath_prepend(str(tmp_path / "standin"))
    monkeypatch.delitem(sys.modules, "aim", raising=False)
    import aim

    yield aim
    sys.modules.pop("aim", None)  # not through monkeypatch: its undo would put the stand-in back


def test_aim_tracks_each_value_in_the_logging_directory_repository(tmp_path, aim_stand_in):
    import torch

    accelerator = Accelerator(cpu=True, log_with="aim", project_dir=tmp_path)
    accelerator.init_trackers("hasten-aim", config={"lr": 0.01}, init_kwargs={"aim": {"experiment": "baseline"}})
    assert accelerator.get_tracker("aim", unwrap=True).__class__ is aim_stand_in.Run
    accelerator.log({"loss": torch.tensor(0.5), "accuracy": 0.75}, step=2, log_kwargs={"aim": {"epoch": 1}})
    tracker = accelerator.get_tracker("aim")
    tracker.log_images({"sample": "pixels", "captioned": ("pixels", "a caption")}, step=2,
                       kwargs={"aim_image": {"format": "jpeg"}, "track": {"context": {"subset": "eval"}}})
    with pytest.raises(ValueError, match=r"got kwargs for \['image'\]; its kwargs is a dict with the keys"):
        tracker.log_images({"sample": "pixels"}, kwargs={"image": {}})
    accelerator.end_training()
    assert aim_stand_in.calls == [
        ("Run", str(tmp_path), "baseline"), ("set", "name", "hasten-aim"), ("item", "hparams", {"lr": 0.01}),
        ("track", 0.5, "loss", 2, 1, None), ("track", 0.75, "accuracy", 2, 1, None),
        ("track", ("Image", "", "jpeg"), "sample", 2, None, {"subset": "eval"}),
        ("track", ("Image", "a caption", "jpeg"), "captioned", 2, None, {"subset": "eval"}),
        ("close",)]


def test_aim_repo_argument_takes_the_logging_directorys_place(tmp_path, aim_stand_in):
    tracker = LOGGER_TYPE_TO_CLASS["aim"]("run", repo=str(tmp_path / "elsewhere"))  # Accelerate's own test passes it
    assert tracker.tracker is None and aim_stand_in.calls == []  # created, not started
    tracker.start()
    assert aim_stand_in.calls[0] == ("Run", str(tmp_path / "elsewhere"), None)


@pytest.mark.skipif(importlib.util.find_spec("aim") is not None, reason="aim is installed")
def test_aim_without_the_package_says_how_to_install_it(tmp_path):
    from hasten.tracking import AimTracker

    with pytest.raises(ImportError, match=r"^log_with='aim' needs the aim package, which is not installed: "
                                          r"pip install aim$"):
        Accelerator(cpu=True, log_with="aim", project_dir=tmp_path)
    with pytest.raises(ImportError, match="pip install aim"):
        AimTracker("run", str(tmp_path))
