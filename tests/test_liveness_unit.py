"""The liveness monitor's judgement on real processes, one look at a time (the clock is the test's).

A child process stands for a launched rank: its heartbeat file is written by the test (or by the real
heartbeat thread), it is really stopped with SIGSTOP, really busy, really killed. The multi-process runs
are in test_liveness.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from hasten.launch.config import ConfigError, LaunchConfig
from hasten.launch.liveness import BLAME_AFTER, Monitor
from hasten.process import heartbeat, watchdog
from hasten.process.heartbeat import heartbeat_path, read_heartbeat

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc, sends SIGSTOP")


@pytest.fixture
def children():
    started: list[subprocess.Popen] = []

    def start(code: str = "import time; time.sleep(120)") -> subprocess.Popen:
        child = subprocess.Popen([sys.executable, "-c", code])
        started.append(child)
        return child

    yield start
    for child in started:
        if child.poll() is None:
            child.kill()
        child.wait()


def beat(directory, rank: int, pid: int, number: int, wait=None) -> None:
    with open(heartbeat_path(str(directory), rank), "w") as handle:
        json.dump({"rank": rank, "pid": pid, "host": "node-a", "beat": number, "wait": wait}, handle)


def stop(child: subprocess.Popen) -> None:
    """SIGSTOP `child` and wait until the kernel shows it stopped (the signal takes effect when it is scheduled)."""
    os.kill(child.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, "the child did not stop"
        time.sleep(0.01)


def gone(child: subprocess.Popen, within: float = 5.0) -> bool:
    try:
        child.wait(within)
    except subprocess.TimeoutExpired:
        return False
    return True


def test_a_stopped_process_is_frozen_after_the_limit_named_and_killed(tmp_path, children):
    waiting, frozen = children(), children()
    gather = {"kind": "hasten", "n": 4, "op": "gather", "site": "train.py:9"}
    monitor = Monitor(str(tmp_path), limit=10.0, world_size=2)
    beat(tmp_path, 0, waiting.pid, 1, gather)
    beat(tmp_path, 1, frozen.pid, 1)
    monitor.look(100.0)
    stop(frozen)
    for now in (100.5, 105.0, 109.5):  # rank 0 beats on; rank 1 is silent, but not yet for the limit
        beat(tmp_path, 0, waiting.pid, int(now), gather)
        monitor.look(now)
    assert monitor.verdict is None and frozen.poll() is None
    beat(tmp_path, 0, waiting.pid, 200, gather)
    monitor.look(110.0)
    assert monitor.verdict == (f"rank 1 of 2 (pid {frozen.pid} on node-a) stopped responding: it is stopped (SIGSTOP, "
                               "or a debugger) and showed no sign of life for 10 s; rank 0 was waiting in gather at "
                               "train.py:9 (collective #4)")
    assert gone(frozen) and frozen.returncode == -signal.SIGKILL  # at once: SIGTERM would wait for a SIGCONT
    assert waiting.poll() is None  # the others are the launcher's to stop...
    monitor.look(110.0 + 6)
    assert gone(waiting) and waiting.returncode == -signal.SIGKILL  # ... and killed a few seconds later if still there


def test_a_busy_process_holding_the_gil_and_one_that_sleeps_are_not_frozen(tmp_path, children):
    busy = children("while True: pass")
    sleeper = children()
    monitor = Monitor(str(tmp_path), limit=3.0, world_size=2)
    beat(tmp_path, 0, busy.pid, 1)
    monitor.look(time.monotonic())
    for _ in range(8):  # 4 s without a heartbeat from rank 0, which computes; rank 1 beats (its thread runs)
        time.sleep(0.5)
        beat(tmp_path, 1, sleeper.pid, _)
        monitor.look(time.monotonic())
    assert monitor.verdict is None and busy.poll() is None and sleeper.poll() is None


def test_when_a_process_ends_the_stopped_one_is_blamed_after_a_few_seconds(tmp_path, children):
    ending, frozen = children(), children()
    monitor = Monitor(str(tmp_path), limit=45.0, world_size=2)
    beat(tmp_path, 0, ending.pid, 1, {"kind": "hasten", "n": 9, "op": "gather", "site": "train.py:9"})
    beat(tmp_path, 1, frozen.pid, 1)
    monitor.look(0.0)
    stop(frozen)
    ending.kill()  # rank 0 ends (its own timeout, say)
    ending.wait()
    monitor.look(1.0)
    assert monitor.verdict is None  # stopped for a moment only: not yet the cause
    monitor.look(BLAME_AFTER + 0.5)
    assert monitor.verdict is not None and monitor.verdict.startswith(f"rank 1 of 2 (pid {frozen.pid} on node-a)")
    assert monitor.verdict.endswith("rank 0 ended while waiting in gather at train.py:9 (collective #9)")
    assert gone(frozen)


def test_a_launcher_that_was_suspended_counts_again(tmp_path, children):
    frozen = children()
    monitor = Monitor(str(tmp_path), limit=10.0, world_size=1)
    beat(tmp_path, 0, frozen.pid, 1)
    monitor.look(0.0)
    stop(frozen)
    monitor.look(30.0)  # the launcher itself did not look for 30 s (a suspended job): no verdict on that
    assert monitor.verdict is None
    monitor.look(35.0)
    assert monitor.verdict is None
    monitor.look(40.5)
    assert monitor.verdict is not None and gone(frozen)


def test_the_heartbeat_thread_beats_every_second_with_where_the_process_waits(tmp_path, monkeypatch):
    monkeypatch.setattr(watchdog, "_published", {"kind": "hasten", "n": 2, "op": "reduce", "site": "x.py:1"})
    heartbeat.start(str(tmp_path), rank=3)
    try:
        path = heartbeat_path(str(tmp_path), 3)
        first = read_heartbeat(path)
        assert first is not None and first["pid"] == os.getpid() and first["beat"] == 0
        time.sleep(2.5)
        later = read_heartbeat(path)
        assert later is not None and later["beat"] >= 1 and later["wait"]["op"] == "reduce"
    finally:
        heartbeat.stop()
    assert not heartbeat.running()


def test_no_heartbeat_where_the_launchers_directory_is_not(tmp_path):
    # a rank on another host (mpirun with a hostfile) cannot write into this machine's directory: no thread, no error
    assert heartbeat.start(str(tmp_path / "not-here"), rank=0) is None and not heartbeat.running()
    assert not (tmp_path / "not-here").exists()


def test_the_exit_rendezvous_waits_for_every_process_and_says_who_left(monkeypatch):
    from torch.distributed import HashStore

    store = HashStore()
    monkeypatch.setattr(watchdog, "_store", store)
    monkeypatch.setattr(watchdog, "_world_size", 2)
    monkeypatch.setattr(watchdog, "_left", None)
    monkeypatch.setattr(watchdog, "_rank", 0)
    assert watchdog.leave_together(timeout=0.3) is False  # rank 1 never came
    published = json.loads(store.get("hasten/watchdog/0"))["wait"]
    assert published["kind"] == "left" and published["pid"] == os.getpid()
    assert watchdog.describe(0, published).endswith(") left the script")
    store.set("hasten/watchdog/left/1", "{}")
    assert watchdog.leave_together(timeout=5) is True


def test_a_process_waiting_on_the_board_is_told_at_once_that_another_left(tmp_path):
    import threading

    from hasten.core.errors import CollectiveDeadlock
    from hasten.process.board import Board

    path = str(tmp_path / "words")
    first, second = (Board(path, rank=r, world_size=2, timeout=30.0) for r in (0, 1))
    together = threading.Thread(target=second.agree, args=(7,))
    together.start()
    assert first.agree(7) is None  # check 1: both were there
    together.join()
    second.leave()  # rank 1 is done: it writes into the slot of check 2 only
    started = time.monotonic()
    with pytest.raises(CollectiveDeadlock, match=rf"^rank 1 \(pid {os.getpid()} on .+\) left the script while rank 0 "
                                                 r"waits in a collective \(check #2 of the host board\), which it will "
                                                 r"never join$"):
        first.agree(7)
    assert time.monotonic() - started < 1  # at once, not after the 30 s timeout


@pytest.mark.parametrize("value, ok", [(0.0, True), (3.0, True), (45.0, True), (1.0, False), (-5.0, False)])
def test_liveness_timeout_is_zero_or_a_few_seconds(value, ok):
    config = LaunchConfig(liveness_timeout=value)
    if ok:
        config.validate()
    else:
        with pytest.raises(ConfigError, match="liveness_timeout must be 0 \\(never\\) or at least 3 seconds"):
            config.validate()
