"""`hasten launch --multi_cpu --mpirun`: Open MPI starts the ranks, gloo connects them.

The real runs need Open MPI's `mpirun` (scripts/setup.sh installs
openmpi-bin when it can) and are skipped without it. The command checks
(`--dry_run`, refusal without mpirun) run everywhere: they put a fake or no
`mpirun` on PATH.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import time
from pathlib import Path

import pytest

from conftest import launch, results_by_rank, run_with_timeout
from hasten.launch.plan import LaunchError, LaunchPlan, available_cpus, find_free_port
from test_multinode import (  # noqa: F401 - single_process is a shared fixture
    CONFIGS, EQUIVALENCE, PROBE, TIMEOUT, assert_matches_single_process, clean_env, single_process,
)

needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None,
                                  reason="Open MPI's mpirun is not installed (scripts/setup.sh installs openmpi-bin)")
MPI = ("--multi_cpu", "--mpirun")


# ---------------------------------------------------------------------------- real mpirun runs
@needs_mpirun
@pytest.mark.multiprocess
def test_mpirun_trains_like_one_process(single_process, tmp_path):
    out = tmp_path / "two"
    launch(PROBE, str(out), *(c[1] for c in CONFIGS.values()), num_processes=2, launch_args=MPI,
           timeout=TIMEOUT, env=clean_env())
    probes = results_by_rank(out / "probe")
    assert sorted(probes) == [0, 1], f"probe files: {sorted(probes)}"
    for rank, info in probes.items():
        env = info["env"]
        # the rank came from Open MPI's variables, not from torchrun's
        assert info["launcher"] == "mpi", info
        assert env["OMPI_COMM_WORLD_RANK"] == str(rank) and env["OMPI_COMM_WORLD_SIZE"] == "2", info
        assert env["RANK"] is None and env["WORLD_SIZE"] is None and env["TORCHELASTIC_RUN_ID"] is None, info
        assert info["world_size"] == 2 and info["local_rank"] == rank, info
        assert info["backend"] == "gloo", info
        assert info["gathered"] == [1, 11] and info["reduced_sum"] == 3.0, info
    assert_matches_single_process(single_process, out)


@needs_mpirun
@pytest.mark.multiprocess
@pytest.mark.parametrize("healthy_rank_is", ["barrier", "busy"])
def test_mpirun_rank_that_raises_fails_the_launch(tmp_path, healthy_rank_is):
    """Rank 1 raises ValueError("boom"); rank 0 waits at a barrier or sleeps 90 s."""
    start = time.monotonic()
    result = launch("mp_rank_raises.py", str(tmp_path), healthy_rank_is, num_processes=2, launch_args=MPI,
                    timeout=TIMEOUT, env=clean_env(), check=False)
    elapsed = time.monotonic() - start
    output = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode != 0, output
    assert elapsed < 60, f"the failed run took {elapsed:.0f}s to end (rank 0 was not stopped)\n{output}"
    marker = "rank0_busy" if healthy_rank_is == "busy" else "rank0_reached_barrier"
    assert (tmp_path / marker).exists(), output  # the failure happened with both ranks running
    assert not (tmp_path / "rank0_done").exists(), output
    stderr = result.stderr
    assert re.search(r"\[hasten\] rank 1 failed with ValueError: boom", stderr), output
    assert "Traceback (most recent call last)" in stderr and 'raise ValueError("boom")' in stderr, output


# ---------------------------------------------------------------------------- commands and refusals
@pytest.fixture
def script(tmp_path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("raise SystemExit('this script must not run in these tests')\n")
    return path


@pytest.fixture
def fake_mpirun(tmp_path) -> str:
    """A PATH whose `mpirun` would fail loudly if it were ever run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mpirun").write_text("#!/bin/sh\necho 'fake mpirun must not run' >&2\nexit 99\n")
    (bin_dir / "mpirun").chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


def hasten_launch(*args: str, path: str) -> tuple[int, str, str]:
    result = run_with_timeout([sys.executable, "-m", "hasten", "launch", *args], 60, clean_env(PATH=path))
    return result.returncode, result.stdout, result.stderr


def test_mpirun_missing_is_refused(script, tmp_path):
    empty = tmp_path / "empty_bin"
    empty.mkdir()
    code, stdout, stderr = hasten_launch(*MPI, "--num_processes", "2", str(script), path=str(empty))
    assert code == 2, stderr
    assert stderr.strip() == ("hasten launch: error: --mpirun needs Open MPI's mpirun on PATH; "
                              "install it (apt-get install openmpi-bin).")
    assert stdout == ""


def test_launch_plan_refuses_mpirun_missing(script, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LaunchError, match="needs Open MPI's mpirun on PATH"):
        LaunchPlan(target=str(script), num_processes=2, mpirun=True).validate()


def test_dry_run_mpirun(script, fake_mpirun):
    port = find_free_port()
    code, stdout, stderr = hasten_launch(*MPI, "--num_processes", "2", "--main_process_port", str(port), "--dry_run",
                                         str(script), "a", "--flag", path=fake_mpirun)
    assert code == 0, stderr
    tokens = shlex.split(stdout)
    start = tokens.index("mpirun")
    env = dict(token.split("=", 1) for token in tokens[:start])
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    oversubscribe = ["--oversubscribe"] if available_cpus() < 2 else []
    assert tokens[start:] == ["mpirun", "-np", "2", "--bind-to", "none", *root, *oversubscribe,
                              "-x", "MASTER_ADDR", "-x", "MASTER_PORT", "-x", "OMP_NUM_THREADS",
                              "-x", "HASTEN_LAUNCH_SPEC", sys.executable, "-m", "hasten.launch.worker",
                              str(script), "a", "--flag"]
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == str(port)
    assert '"cpu": true' in env["HASTEN_LAUNCH_SPEC"]


def test_mpirun_argv_root_oversubscribe_and_hostfile(script, tmp_path):
    plan = LaunchPlan(target=str(script), num_processes=4, mpirun=True, main_process_port=29501)
    as_user = plan.mpirun_argv(is_root=False, cpus=2)
    assert as_user[:6] == ["mpirun", "-np", "4", "--bind-to", "none", "--oversubscribe"]
    assert "--allow-run-as-root" not in as_user
    assert plan.mpirun_argv(is_root=True, cpus=8)[:6] == ["mpirun", "-np", "4", "--bind-to", "none",
                                                            "--allow-run-as-root"]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=4\n")
    with_hosts = LaunchPlan(target=str(script), num_processes=4, mpirun=True, mpirun_hostfile=str(hostfile))
    argv = with_hosts.mpirun_argv(is_root=False, cpus=2)
    assert argv[5:7] == ["--hostfile", str(hostfile)] and "--oversubscribe" not in argv
    env = plan.worker_env({})
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == "29501"
