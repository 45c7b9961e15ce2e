"""save_state called on the main process only (the diffusers pattern), on 2 real processes (gloo).

Under Accelerate, ``if accelerator.is_main_process: accelerator.save_state(path)`` makes no collective with an
explicit directory, so the main process writes what it holds while the others train on. hasten does the same
where the main process holds the whole state (DDP), and fails within seconds in one sentence where the state is
sharded (FSDP) — never a hang. Calling it on every process keeps the agreed, checked save.
"""

import json

import pytest

from conftest import launch, results_by_rank

pytestmark = pytest.mark.multiprocess

ACCELERATE_FILES = ["custom_checkpoint_0.pkl", "model.safetensors", "optimizer.bin", "random_states_0.pkl",
                    "scheduler.bin"]


def test_main_only_save_under_ddp_is_quick_and_loads_on_every_process(tmp_path):
    result = launch("ckpt_main_only.py", str(tmp_path), "ddp", "main", num_processes=2, timeout=120)
    ranks = results_by_rank(tmp_path)
    assert sorted(ranks) == [0, 1]
    assert ranks[0]["save_seconds"] < 10, ranks[0]  # ~1-2 s: the others' watchdogs show them waiting in DDP's all-reduce
    assert "save_seconds" not in ranks[1]
    # exactly what Accelerate writes from the main process alone, plus hasten's manifest
    assert ranks[0]["files"] == sorted([*ACCELERATE_FILES, "hasten_checkpoint.json"])
    manifest = json.loads((tmp_path / "ckpt" / "hasten_checkpoint.json").read_text())
    assert manifest["saved_by"] == [0] and manifest["num_processes"] == 2
    for rank in (0, 1):  # loading on every process afterwards: the saved model, counter, scheduler
        assert ranks[rank]["model_restored"] and ranks[rank]["counter"] == 3, ranks[rank]
        assert ranks[rank]["lr"] == ranks[rank]["saved_lr"]
    assert ranks[0]["save_iteration"] == 1 and ranks[1]["save_iteration"] == 0  # only the saving process counts it
    # the other process keeps its own RNG state, and says so once
    assert result.stdout.count("has no RNG state for process 1 (it was saved by the main process alone)") == 1


def test_every_process_saving_under_ddp_agrees_and_writes_every_rng_state(tmp_path):
    launch("ckpt_main_only.py", str(tmp_path), "ddp", "all", num_processes=2, timeout=120)
    ranks = results_by_rank(tmp_path)
    assert ranks[0]["path"] == ranks[1]["path"] == str(tmp_path / "ckpt")
    assert ranks[0]["files"] == sorted([*ACCELERATE_FILES, "hasten_checkpoint.json", "random_states_1.pkl"])
    assert json.loads((tmp_path / "ckpt" / "hasten_checkpoint.json").read_text())["saved_by"] == [0, 1]
    assert all(r["model_restored"] and r["save_iteration"] == 1 for r in ranks.values())


def test_main_only_save_under_fsdp_fails_fast_in_one_sentence(tmp_path):
    result = launch("ckpt_main_only.py", str(tmp_path), "fsdp", "main", num_processes=2, timeout=120, check=False)
    assert result.returncode == 1
    report = json.loads((tmp_path / "rank0.json").read_text())
    assert report["save_seconds"] < 10, report
    assert report["save_error"].startswith(
        "CheckpointError: save_state needs every process under FSDP, which holds the state in shards, but only some "
        "called it (rank 1 ")
    assert "rank 1 went on to its next training batch" in report["save_error"] or "rank 1 waits in " in report["save_error"]
    assert report["save_error"].endswith("call accelerator.save_state(...) on every process, not only inside "
                                         "`if accelerator.is_main_process:`.")
    assert not (tmp_path / "ckpt").exists()


def test_automatic_naming_and_rotation_stay_in_step_across_main_only_and_shared_saves(tmp_path):
    # Accelerate's automatic naming calls wait_for_everyone, so there a main-only call hangs; here it works, and a
    # later save by every process takes the main process's number (the others never counted the main-only ones).
    launch("ckpt_auto_main_only.py", str(tmp_path), num_processes=2, timeout=120)
    ranks = results_by_rank(tmp_path)
    root = tmp_path / "project" / "checkpoints"
    assert ranks[0]["main_only"] == [str(root / f"checkpoint_{i}") for i in range(3)]
    assert ranks[1]["main_only"] == [] and ranks[1]["iteration_before_all"] == 0
    for rank in (0, 1):
        assert ranks[rank]["all"] == str(root / "checkpoint_3"), ranks[rank]
        assert ranks[rank]["iteration_after_all"] == 4
        assert ranks[rank]["listed"] == ["checkpoint_2", "checkpoint_3"]  # total_limit=2
        assert ranks[rank]["loaded"] == str(root / "checkpoint_3") and ranks[rank]["iteration_after_load"] == 4
