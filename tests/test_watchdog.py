"""A certain deadlock ends the run within seconds, whatever the timeout; a slow rank is not one."""

import subprocess
import time

import pytest

from conftest import launch

pytestmark = pytest.mark.multiprocess


def test_skipped_barrier_ends_in_seconds_naming_both_ranks():
    started = time.monotonic()
    result = launch("mp_skip_barrier.py", num_processes=2, check=False, timeout=90)  # default 30-minute group timeout
    assert time.monotonic() - started < 60
    assert result.returncode == 1 and "UNREACHABLE" not in result.stdout
    summary = [line for line in result.stderr.splitlines() if line.startswith("hasten launch:")]
    assert len(summary) == 1, result.stderr
    assert ("rank 0 waits in wait_for_everyone at mp_skip_barrier.py:9 (collective #1) while rank 1 waits in gather "
            "at mp_skip_barrier.py:10 (collective #1)") in summary[0]
    assert "[hasten] rank 0 is stuck here:" in result.stderr and "[hasten] rank 1 is stuck here:" in result.stderr
    left = subprocess.run(["pgrep", "-f", "mp_skip_barrier.py"], capture_output=True, text=True)
    assert left.stdout == "", "no process may be left behind"


def test_a_slow_rank_is_not_a_deadlock():
    result = launch("mp_slow_rank.py", num_processes=2, timeout=90)
    assert result.stdout.count("DONE 2.0") == 2


def test_a_plain_stall_is_reported_at_the_timeout_with_where_each_rank_was():
    # rank 1 computes for 30 s while rank 0 waits in a gather; the group's timeout is 8 s
    started = time.monotonic()
    result = launch("mp_stall.py", num_processes=2, check=False, timeout=90)
    assert time.monotonic() - started < 30
    assert result.returncode == 1 and "UNREACHABLE" not in result.stdout
    summary = [line for line in result.stderr.splitlines() if line.startswith("hasten launch:")]
    assert len(summary) == 1 and "CollectiveTimeout: gather timed out: " in summary[0], result.stderr
    assert ("rank 0 waits in gather at mp_stall.py:13 (collective #1); rank 1 is elsewhere (computing, or in a "
            "collective of torch's own)") in summary[0]
