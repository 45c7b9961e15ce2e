"""diffusers on hasten through the accelerate switch: the same loading, hooks and training checkpoints as on Accelerate.

- ``scripts/diffusers_loading_client.py`` never imports accelerate:
  diffusers does (``init_empty_weights``, ``infer_auto_device_map``,
  ``get_balanced_memory``, ``dispatch_model``, ``set_module_tensor_to_device``,
  ``offload_weight``, the hooks, ``cpu_offload[_with_hook]``). It loads tiny
  models built from configs with ``DiffusionPipeline.from_pretrained(...,
  device_map=...)``, ``low_cpu_mem_usage`` and ``device_map="auto"`` / dicts
  with CPU and disk offload, offloads pipelines (``enable_model_cpu_offload``,
  ``enable_sequential_cpu_offload``, ComponentsManager's hooks), and runs
  them; its record (device maps, hooks, parameter devices, offload files,
  outputs) must be the same under both libraries, the outputs bit for bit.
  One exception: on the CPU, Accelerate 1.16 fails sequential offload
  (see ``ACCELERATE_FAILS_ON_CPU``); hasten's images are then compared with
  the unhooked pipeline's.
- ``scripts/diffusers_client.py`` (diffusers' train_unconditional style,
  save/load hooks behind ``accelerate.__version__ >= 0.16.0``) runs
  unchanged with ``hasten launch --as-accelerate`` instead of with its
  imports rewritten: the same per-step losses and the same checkpoint files.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import sys
import threading
from pathlib import Path

import pytest

from conftest import run_with_timeout

from .harness import (PEER, SCRIPTS, STEP_FIELDS, Run, Runs, first_difference, free_port, peer_entry, read_records,
                      restore_cached, store_cached)
from .test_checkpoint import files, first_unequal, read, unexplained_extra

pytest.importorskip("diffusers")
np = pytest.importorskip("numpy")
pytestmark = [pytest.mark.parity, pytest.mark.timeout(600)]
LOADING = SCRIPTS / "diffusers_loading_client.py"
# Accelerate 1.16's cpu_offload with the execution device torch.device("cpu:0") (what diffusers'
# enable_sequential_cpu_offload(device="cpu") passes) raises TypeError in the first forward's post_forward
# (set_module_tensor_to_device back to meta); hasten runs it. Only where an accelerator is the device do both run.
ACCELERATE_FAILS_ON_CPU = {"pipeline_sequential_cpu_offload": "TypeError"}


def environment() -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    for name in ("ACCELERATE_MIXED_PRECISION", "HASTEN_CPU_FP16"):  # parity is about defaults (see harness.py)
        env.pop(name, None)
    return env


def run_loading(out: Path, switch: bool) -> tuple[dict, dict]:
    """The loading client's record and arrays, under hasten (``switch``) or Accelerate (cached as harness does)."""
    entry = None if switch else peer_entry(LOADING, 1, ["loading", md.version("diffusers")])
    if not restore_cached(entry, out):
        command = [sys.executable, str(LOADING), "--out", str(out), *(["--switch"] if switch else [])]
        result = run_with_timeout(command, 240, environment())
        assert result.returncode == 0 and (out / "result.json").exists(), result.stdout + result.stderr[-4000:]
        store_cached(entry, out)
    with np.load(out / "arrays.npz") as arrays:
        return json.loads((out / "result.json").read_text()), {k: arrays[k] for k in arrays.files}


@pytest.fixture(scope="module")
def loading(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, dict]]:
    """Both libraries' loading runs, started side by side (each is one process)."""
    root = tmp_path_factory.mktemp("diffusers_loading")
    done: dict[str, tuple[dict, dict]] = {}
    errors: list[BaseException] = []

    def one(lib: str) -> None:
        try:
            done[lib] = run_loading(root / lib, switch=lib != PEER)
        except BaseException as error:  # pytest.fail raises an outcome exception: reported below
            errors.append(error)

    threads = [threading.Thread(target=one, args=(lib,)) for lib in (PEER, "hasten")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return done


def test_diffusers_loads_and_offloads_like_accelerate(loading: dict[str, tuple[dict, dict]]) -> None:
    (theirs, their_arrays), (ours, our_arrays) = loading[PEER], loading["hasten"]
    assert theirs["served_by"] == "accelerate.accelerator" and ours["served_by"] == "hasten.accelerator"
    assert ours["accelerate"] == "1.16.0"  # diffusers' version checks see Accelerate's version
    assert sorted(theirs["cases"]) == sorted(ours["cases"])
    differ = []
    for name, expected in theirs["cases"].items():
        if not expected["ok"] and ACCELERATE_FAILS_ON_CPU.get(name) == expected["error"]:
            continue  # compared with the reference below
        got = ours["cases"][name]
        if got != expected:
            fields = sorted(f for f in set(expected) | set(got) if expected.get(f) != got.get(f))
            differ += [f"{name}.{f}: Accelerate {str(expected.get(f))[:300]} vs hasten {str(got.get(f))[:300]}"
                       for f in fields]
    assert not differ, "records differ from Accelerate's:\n" + "\n".join(differ)
    # the cases that must run under both, and what they covered
    ran = {name for name, case in ours["cases"].items() if case["ok"]}
    assert {"pipeline_device_map_cpu", "pipeline_device_map_balanced", "pipeline_model_cpu_offload",
            "dit_device_map_balanced", "dit_model_cpu_offload", "components_manager_offload_hooks",
            "unet_group_offload", "cond_auto_third", "cond_auto_three_quarters", "cond_dict_disk_offload"} <= ran
    assert ours["cases"]["cond_auto_third"]["hf_device_map"] == {"": "disk"}
    assert {"cpu", "disk"} == set(ours["cases"]["cond_auto_three_quarters"]["hf_device_map"].values())
    assert ours["cases"]["pipeline_model_cpu_offload"]["hooks"][""][0][0] == "CpuOffload"
    assert ours["cases"]["dit_model_cpu_offload"]["chained"]  # the vae's hook offloads the transformer first
    assert ours["cases"]["group_offload_refused_over_accelerate_hooks"]["error"] == "ValueError"  # isinstance saw it
    assert set(their_arrays) <= set(our_arrays) and set(our_arrays) - set(their_arrays) <= set(ACCELERATE_FAILS_ON_CPU)
    for key, expected in their_arrays.items():
        got = our_arrays[key]
        assert expected.tobytes() == got.tobytes(), f"{key}: max |difference| {abs(expected - got).max()}"
    for key in set(our_arrays) - set(their_arrays):  # ran under hasten only: the unhooked pipeline's images
        assert our_arrays[key].tobytes() == our_arrays["pipeline_reference"].tobytes(), key


def switch_run(out: Path, nproc: int, *args: str) -> Run:
    """diffusers_client.py unchanged under ``hasten launch --as-accelerate`` (no import rewritten)."""
    several = ["--num_processes", str(nproc), "--main_process_port", str(free_port())] if nproc > 1 else []
    command = [sys.executable, "-m", "hasten", "launch", "--as-accelerate", *several,
               str(SCRIPTS / "diffusers_client.py"), *args, "--out", str(out)]
    result = run_with_timeout(command, 120, environment())
    run = Run("hasten", "diffusers_client (switch)", nproc, out, result.returncode, result.stdout + result.stderr,
              read_records(out) if out.exists() else [])
    if result.returncode != 0 or len(run.of("done")) != nproc:
        pytest.fail(f"hasten launch --as-accelerate exited {result.returncode}:\n{run.output[-4000:]}", pytrace=False)
    return run


@pytest.mark.multiprocess
def test_diffusers_training_example_checkpoints_like_accelerate(runs: Runs, tmp_path: Path) -> None:
    """2 processes: the version check registers the save/load hooks; same steps, same checkpoint files and values."""
    peer = runs.script("diffusers_client", PEER, 2, "--cpu")
    peer.check()
    ours = switch_run(tmp_path / "switch", 2, "--cpu")
    assert [r["hooks"] for r in ours.of("setup")] == [True, True]
    for kind, fields in (("step", STEP_FIELDS), ("final", ("params",)), ("saved", ("path", "step"))):
        expected = peer.of(kind)
        assert expected, f"Accelerate's run wrote no {kind!r} record"
        difference = first_difference(expected, ours.of(kind), fields)
        assert difference is None, f"{kind} records:\n{difference}"
    problems = []
    for record in peer.of("saved"):
        theirs, mine = peer.out / record["path"], ours.out / record["path"]
        missing, extra = sorted(files(theirs) - files(mine)), unexplained_extra(files(theirs), files(mine))
        if missing or extra:
            problems.append(f"{record['path']}: lacks {missing}, adds {extra}")
            continue
        assert "unet/diffusion_pytorch_model.safetensors" in files(mine)  # the save hook wrote the model
        problems += [f"{record['path']}/{name}{found}" for name in sorted(files(theirs))
                     if (found := first_unequal(read(theirs / name), read(mine / name)))]
    assert not problems, "checkpoints differ from Accelerate's:\n" + "\n".join(problems)


@pytest.mark.multiprocess
def test_diffusers_training_example_resumes_from_an_accelerate_checkpoint(runs: Runs, tmp_path: Path) -> None:
    """2 processes: the load hook reads Accelerate's checkpoint-4 (model in unet/); the steps go on as Accelerate's."""
    saved = runs.script("diffusers_client", PEER, 2, "--cpu")
    peer = runs.script("diffusers_client", PEER, 2, "--cpu", resume_from="checkpoint-4")
    peer.check()
    ours = switch_run(tmp_path / "resumed", 2, "--cpu", "--resume_from_checkpoint", "checkpoint-4",
                      "--checkpoints", str(saved.out))
    for kind, fields in (("loaded", ("path", "lr")), ("step", STEP_FIELDS), ("final", ("params",))):
        difference = first_difference(peer.of(kind), ours.of(kind), fields)
        assert peer.of(kind) and difference is None, f"{kind} records:\n{difference}"
