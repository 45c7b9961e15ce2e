"""A certain deadlock ends the run within seconds, whatever the timeout; a slow rank is not one.

The limit: a run whose processes all wait, in different places, ends with the report within about 5 s of the
moment the last one blocked (a wait is published after 1 s; the same picture must hold for 2 s more); the tests
allow 15 s for a loaded machine. That holds for hasten's own collectives and for those it did not start (a plain
torch.distributed call, DDP's all-reduce inside backward), never the process group's 30-minute timeout.
"""

import re
import subprocess
import time

import pytest

from conftest import SCRIPTS, launch

pytestmark = pytest.mark.multiprocess

LIMIT = 15.0  # seconds from the moment both processes wait to the end of the run (about 5 on a quiet machine)


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


def _marked_line(mode: str, rank: int) -> int:
    lines = (SCRIPTS / "mp_foreign_wait.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.rstrip().endswith(f"# WAIT:{mode}:{rank}"))


@pytest.mark.parametrize("mode, rank1_waits_in", [
    ("barrier", "torch.distributed.barrier"),
    ("all_reduce", "torch.distributed.all_reduce"),
    ("ddp", "backward (gradient all-reduce)"),
])
def test_a_wait_in_a_collective_hasten_did_not_start_is_reported_in_seconds(mode, rank1_waits_in):
    result = launch("mp_foreign_wait.py", mode, num_processes=2, check=False, timeout=120)
    ended = time.time()
    assert result.returncode == 1 and "UNREACHABLE" not in result.stdout, result.stderr
    waiting = [float(t) for t in re.findall(r"WAITING \d (\d+\.\d+)", result.stdout)]
    assert len(waiting) == 2, result.stdout
    assert ended - max(waiting) < LIMIT, f"reported {ended - max(waiting):.1f} s after both processes waited"
    summary = [line for line in result.stderr.splitlines() if line.startswith("hasten launch:")]
    assert len(summary) == 1, result.stderr
    assert "CollectiveDeadlock: the processes wait in different collectives, so none can continue" in summary[0]
    assert (f"rank 0 waits in gather at mp_foreign_wait.py:{_marked_line('any', 0)} (collective #2) while rank 1 "
            f"waits in {rank1_waits_in} at mp_foreign_wait.py:{_marked_line(mode, 1)}") in summary[0]
    assert "[hasten] rank 0 is stuck here:" in result.stderr and "[hasten] rank 1 is stuck here:" in result.stderr


def test_a_rank_that_computes_while_another_waits_in_a_barrier_is_not_reported():
    # rank 1 computes for ~8 s (a plain torch loop) while rank 0 waits in dist.barrier(): slow, not a deadlock
    result = launch("mp_foreign_wait.py", "compute", num_processes=2, timeout=120)
    assert sorted(re.findall(r"DONE (\d)", result.stdout)) == ["0", "1"]
    assert "CollectiveDeadlock" not in result.stderr


def test_a_slow_rank_is_not_a_deadlock():
    result = launch("mp_slow_rank.py", num_processes=2, timeout=90)
    assert result.stdout.count("DONE 2.0") == 2


def test_a_plain_stall_is_reported_at_the_timeout_with_where_each_rank_was():
    # rank 1 sleeps for 30 s while rank 0 waits in a gather; the group's timeout is 8 s
    started = time.monotonic()
    result = launch("mp_stall.py", num_processes=2, check=False, timeout=90)
    assert time.monotonic() - started < 30
    assert result.returncode == 1 and "UNREACHABLE" not in result.stdout
    summary = [line for line in result.stderr.splitlines() if line.startswith("hasten launch:")]
    assert len(summary) == 1 and "CollectiveTimeout: gather timed out: " in summary[0], result.stderr
    assert ("rank 0 waits in gather at mp_stall.py:13 (collective #1); rank 1 is elsewhere (computing, or waiting "
            "where hasten cannot see)") in summary[0]
