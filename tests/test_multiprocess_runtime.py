"""What every launched process sees: real world size, thread count, spec, adoption, shutdown, debug checks."""

import sys

import pytest

from conftest import SCRIPTS, launch, results_by_rank, run_with_timeout

pytestmark = pytest.mark.multiprocess


def test_cpu_two_processes_really_start_two_with_the_spec(tmp_path):
    launch("mp_runtime.py", str(tmp_path), "facts", launch_args=("--cpu", "--mixed_precision", "bf16"))
    ranks = results_by_rank(tmp_path)
    assert sorted(ranks) == [0, 1]
    for rank, facts in ranks.items():
        assert facts["world_size"] == 2 and facts["rank"] == rank
        assert facts["distributed_type"] == "MULTI_CPU" and facts["device"] == "cpu"
        assert facts["mixed_precision"] == "bf16"  # from the launch spec
        assert facts["omp_threads"] is not None and int(facts["omp_threads"]) >= 1


def test_plain_accelerator_under_a_launch_is_distributed_without_cpu_flag(tmp_path):
    launch("mp_runtime.py", str(tmp_path), "facts")
    assert {r["world_size"] for r in results_by_rank(tmp_path).values()} == {2}


def test_users_process_group_is_adopted(tmp_path):
    launch("mp_runtime.py", str(tmp_path), "adopt")
    for facts in results_by_rank(tmp_path).values():
        assert facts["same_group"] and facts["sum"] == 3.0


def test_debug_mode_names_mismatched_shapes(tmp_path):
    launch("mp_runtime.py", str(tmp_path), "debug", launch_args=("--debug",))
    for facts in results_by_rank(tmp_path).values():
        assert "gather needs the same shape and dtype on every process" in facts["error"]
        assert "rank 0: (2, 3)" in facts["error"] and "rank 1: (3, 3)" in facts["error"]


def test_plain_torchrun_script_that_forgets_end_training_leaves_the_group(tmp_path):
    # Started by torchrun itself (not hasten launch): hasten's atexit hook must do barrier + destroy.
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               str(SCRIPTS / "mp_runtime.py"), str(tmp_path), "forget"]
    result = run_with_timeout(command, 120)
    assert result.returncode == 0, result.stderr
    assert all(r["group_destroyed_at_exit"] for r in results_by_rank(tmp_path).values())
    assert len(results_by_rank(tmp_path)) == 2
