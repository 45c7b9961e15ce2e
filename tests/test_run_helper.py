"""The tests' own process runner (`conftest.run_with_timeout`): nothing a command started outlives it.

A launcher may start its ranks in sessions of their own (torch's elastic
agent does); one left behind holds the output pipes open. Killing the
launcher's process group does not reach it, and reading the pipes to their
end then waits forever: a CI run once hung so on a rank of Accelerate's
that deadlocked in torch's exit.
"""

from __future__ import annotations

import sys
import time

import pytest

from conftest import run_with_timeout

# Starts a grandchild in a new session that holds stdout and sleeps, prints its pid, and exits (or sleeps too).
LEAVES_A_RANK = """
import subprocess, sys, time
rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print(rank.pid, flush=True)
if sys.argv[1] == "hang":
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("leftovers_fail", [True, False])
def test_a_process_left_in_its_own_session_is_killed_once_the_command_has_exited(leftovers_fail):
    start = time.monotonic()
    if leftovers_fail:
        with pytest.raises(pytest.fail.Exception, match="exited 0 but left processes running, killed after 2s"):
            run_with_timeout([sys.executable, "-c", LEAVES_A_RANK, "exit"], 60, leftover_grace=2)
    else:
        result = run_with_timeout([sys.executable, "-c", LEAVES_A_RANK, "exit"], 60, leftovers_fail=False,
                                  leftover_grace=2)
        assert result.returncode == 0
        rank = int(result.stdout.split()[0])
        time.sleep(0.5)
        assert not _alive(rank)
    assert time.monotonic() - start < 30


def test_a_timeout_kills_processes_in_other_sessions_too():
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="timed out after 3s") as failed:
        run_with_timeout([sys.executable, "-c", LEAVES_A_RANK, "hang"], 3)
    rank = int(str(failed.value).split("stdout:\n")[1].split()[0])
    time.sleep(0.5)
    assert not _alive(rank) and time.monotonic() - start < 30


def test_a_command_whose_work_is_done_but_whose_exit_hangs_is_killed_after_the_grace(tmp_path):
    """How a peer run that finished its records but hangs in torch's exit is ended (tests/parity/harness.py)."""
    marker = tmp_path / "done"
    script = f"import pathlib, time; pathlib.Path({str(marker)!r}).write_text('x'); print('worked', flush=True); time.sleep(600)"
    start = time.monotonic()
    result = run_with_timeout([sys.executable, "-c", script], 60, leftover_grace=2, finished=marker.exists)
    assert result.stdout == "worked\n" and result.returncode == -9 and "its exit hung" in result.stderr
    assert time.monotonic() - start < 30
