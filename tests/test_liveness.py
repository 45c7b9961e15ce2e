"""A frozen rank, a rank that leaves early, a rank that is only slow: each run ends (or not) as it should.

Real processes and real signals: a rank is frozen with SIGSTOP (its every thread stops, as in a paused VM),
a rank returns from its script while the other waits in a collective. The launcher must end the run within
its liveness limit (a short one here: 5 s) naming the frozen rank, its pid and host and where the others
waited, and leave no process behind (a stopped one ignores SIGTERM: it must get SIGKILL). A rank that left
is named within seconds. A rank that sleeps or computes holding the GIL for twice the limit is not
frozen (the heartbeat thread runs while the main thread sleeps; CPU time says it computes).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import SCRIPTS, launch
from test_launch_signals import kill_all, processes_with, wait_gone

pytestmark = [pytest.mark.multiprocess,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc, sends SIGSTOP")]

SCRIPT = SCRIPTS / "mp_liveness.py"
LIMIT = 5  # --liveness_timeout of these tests (the default is 45)
START_TIMEOUT = 120  # the machine may be busy with other test runs


def _marked_line(mark: str) -> int:
    lines = SCRIPT.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.rstrip().endswith(f"# {mark}"))


def _freeze_rank_1(tmp_path: Path, launch_args: tuple[str, ...], env: dict[str, str] | None = None):
    """Start the freeze script, SIGSTOP rank 1 once every rank is in its loop; (exit code, seconds, output, pid, token)."""
    token = f"hasten-liveness-test-{uuid.uuid4().hex}"
    out, log = tmp_path / "out", tmp_path / "launcher.log"
    command = [sys.executable, "-m", "hasten", "launch", "--num_processes", "2", *launch_args, str(SCRIPT),
               "freeze", str(out), token]
    with open(log, "w") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not (out / "ready.rank1").exists() or not (out / "ready.rank1").read_text():
            assert process.poll() is None, f"the run ended before rank 1 was ready:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"rank 1 was not ready after {START_TIMEOUT} s:\n{log.read_text()}"
            time.sleep(0.1)
        pid = int((out / "ready.rank1").read_text())
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            code = process.wait(120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run did not end within 120 s of the freeze:\n{log.read_text()}")
        return code, time.monotonic() - stopped, log.read_text(), pid, token
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        kill_all(processes_with(token))


def _assert_nothing_left(token: str, output: str) -> None:
    left = wait_gone(token, 10)
    kill_all(left)
    assert not left, f"processes outlived the run: {left}\n{output}"


def test_a_frozen_rank_ends_the_run_within_the_limit_naming_it(tmp_path):
    code, seconds, output, pid, token = _freeze_rank_1(tmp_path, ("--liveness_timeout", str(LIMIT)))
    _assert_nothing_left(token, output)  # the stopped rank too: it ignores SIGTERM
    assert code == 1, output
    assert seconds < LIMIT + 10, f"ended {seconds:.1f} s after the freeze (limit {LIMIT} s):\n{output}"
    summary = [line for line in output.splitlines() if line.startswith("hasten launch:")]
    assert len(summary) == 1, output
    assert re.fullmatch(
        rf"hasten launch: rank 1 of 2 \(pid {pid} on {re.escape(socket.gethostname())}\) stopped responding: "
        r"it is stopped \(SIGSTOP, or a debugger\) and showed no sign of life for \d+ s; "
        r"rank 0 was waiting in gather at mp_liveness\.py:\d+ \(collective #\d+\)", summary[0]), summary[0]


def test_the_frozen_rank_is_blamed_when_another_one_times_out_first(tmp_path):
    # the group's timeout (8 s) runs out on rank 0 long before the liveness limit (the default, 45 s)
    code, seconds, output, pid, token = _freeze_rank_1(tmp_path, (), env={"GROUP_TIMEOUT": "8"})
    _assert_nothing_left(token, output)
    assert code == 1, output
    assert seconds < 30, f"ended {seconds:.1f} s after the freeze:\n{output}"
    summary = [line for line in output.splitlines() if line.startswith("hasten launch:")]
    assert len(summary) == 1, output
    assert summary[0].startswith(f"hasten launch: rank 1 of 2 (pid {pid} on {socket.gethostname()}) stopped "
                                 "responding: it is stopped (SIGSTOP, or a debugger)"), summary[0]
    assert "rank 0 ended while waiting in gather at mp_liveness.py:" in summary[0], summary[0]


@pytest.mark.parametrize("mode, waits_in", [("leave-gather", "gather"), ("leave-barrier", "wait_for_everyone")])
def test_a_rank_that_leaves_early_ends_the_run_in_seconds_naming_it(mode, waits_in):
    token = f"hasten-liveness-test-{uuid.uuid4().hex}"
    result = launch(SCRIPT, mode, "/tmp/unused", token, check=False, timeout=120)
    ended = time.time()
    output = result.stdout + result.stderr
    _assert_nothing_left(token, output)
    assert result.returncode == 1 and "UNREACHABLE" not in result.stdout, output
    left = float(re.search(r"LEFT (\d+\.\d+)", result.stdout).group(1))
    assert ended - left < 30, f"the run ended {ended - left:.1f} s after rank 1 left:\n{output}"
    summary = [line for line in result.stderr.splitlines() if line.startswith("hasten launch:")]
    assert len(summary) == 1, output
    line = _marked_line(f"WAIT:{mode.split('-')[1]}")
    assert re.search(
        rf"CollectiveDeadlock: rank 1 \(pid \d+ on {re.escape(socket.gethostname())}\) left the script while rank 0 "
        rf"waits in {waits_in} at mp_liveness\.py:{line} \(collective #2\), which it will never join", summary[0]), summary[0]
    assert "[hasten] rank 1 is stuck here" not in result.stderr  # it is not stuck: it left


def test_a_rank_that_ends_training_tells_a_rank_waiting_in_a_gather_at_once():
    # end_training posts on the host board that the process left (before its exit rendezvous): the rank waiting in
    # a checked collective raises at its next look, naming both, instead of the watchdog's verdict seconds later.
    token = f"hasten-liveness-test-{uuid.uuid4().hex}"
    result = launch(SCRIPT, "end-gather", "/tmp/unused", token, check=False, timeout=120)
    output = result.stdout + result.stderr
    _assert_nothing_left(token, output)
    assert result.returncode == 1 and "UNREACHABLE" not in result.stdout, output
    summary = [line for line in result.stderr.splitlines() if line.startswith("hasten launch:")]
    assert len(summary) == 1, output
    assert re.search(
        rf"CollectiveDeadlock: rank 1 \(pid \d+ on {re.escape(socket.gethostname())}\) ended its process group while "
        rf"rank 0 waits in gather at mp_liveness\.py:{_marked_line('WAIT:endgather')} \(collective #2\), which it will "
        "never join", summary[0]), summary[0]
    assert "is stuck here" not in result.stderr  # told by the board, not found by the watchdog's deadlock verdict


def test_a_rank_that_sleeps_or_holds_the_gil_twice_the_limit_is_not_frozen():
    result = launch(SCRIPT, "slow", "/tmp/unused", "slow", str(2 * LIMIT), launch_args=("--liveness_timeout", str(LIMIT)),
                    timeout=180)
    assert sorted(re.findall(r"DONE (\d)", result.stdout)) == ["0", "1"], result.stdout + result.stderr
    assert "stopped responding" not in result.stderr


def test_a_stopped_rank_of_a_launcher_killed_with_sigkill_ends_too(tmp_path):
    # Linux's parent-death SIGTERM stays pending in a stopped process: without the launcher's guardian,
    # rank 1 would stay stopped forever once the launcher is gone.
    token = f"hasten-liveness-test-{uuid.uuid4().hex}"
    out, log = tmp_path / "out", tmp_path / "launcher.log"
    command = [sys.executable, "-m", "hasten", "launch", "--num_processes", "2", str(SCRIPT), "freeze", str(out), token]
    with open(log, "w") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while len([p for p in out.glob("ready.rank*") if p.read_text()]) < 2:
            assert process.poll() is None, f"the run ended before the ranks were ready:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"the ranks were not ready after {START_TIMEOUT} s:\n{log.read_text()}"
            time.sleep(0.1)
        stopped = int((out / "ready.rank1").read_text())
        os.kill(stopped, signal.SIGSTOP)
        time.sleep(0.5)
        assert Path(f"/proc/{stopped}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"  # really stopped
        process.kill()  # SIGKILL to the launcher alone: nothing of it runs any more
        process.wait()
        left = wait_gone(token, 30)  # the guardian continues the ranks, waits 10 s, then kills what is left
        assert not left, f"ranks outlived their launcher killed with SIGKILL: {left}\n{log.read_text()}"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        kill_all(processes_with(token))
