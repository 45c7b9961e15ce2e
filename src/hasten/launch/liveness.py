"""The launcher's watch over its processes' signs of life: a frozen process ends the run, named.

Each launched process renews a heartbeat file once a second from a thread
of its own (`hasten.process.heartbeat`). A monitor thread beside the
launcher reads them twice a second, with each process's state, CPU time and
I/O counters from ``/proc``. A process is *frozen* when, for
``liveness_timeout`` seconds (default 45), it renewed no heartbeat, used
under 2% of a core and read or wrote under 1 MiB — true of a stopped
process (SIGSTOP, a paused VM), one blocked in the kernel (a hung file
system) or one whose every thread waits; never of one that computes, saves,
compiles or waits for data, whose heartbeat thread runs on. Progress is not
liveness: a slow step is never judged here (the watchdog and the process
group's timeout are about progress).

The monitor then prints nothing itself: it kills the frozen process at once
(SIGKILL: a stopped process ignores SIGTERM until it is continued), the
launcher ends the others as after any failure, kills whatever is still
there a few seconds later, and its one line names the frozen process and
what the others were waiting in (from their heartbeats: where their
watchdogs saw them wait)::

    rank 1 of 2 (pid 28652 on node-a) stopped responding: it is stopped (SIGSTOP, or a debugger)
    and showed no sign of life for 45 s; rank 0 was waiting in gather at train.py:40 (collective #7)

When a process ends (a timeout, say) while another has been stopped for a
few seconds already, the stopped one is the cause and is named at once,
rather than the one that only timed out waiting for it. A launcher that was
itself suspended (its own looks far apart) starts counting again.
"""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..process.heartbeat import read_heartbeat

__all__ = ["Monitor", "judge", "ProcessView"]

LOOK_EVERY = 0.5  # seconds between two looks
BLAME_AFTER = 5.0  # a process stopped this long is blamed at once when another one ends
KILL_AFTER = 5.0  # seconds after a verdict when every process still there is killed
CPU_SHARE = 0.02  # a silent process that used this share of a core is computing, not frozen
IO_BYTES = 1 << 20  # ... or one that read or wrote this much
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

_STATES = {
    "T": "it is stopped (SIGSTOP, or a debugger)",
    "t": "it is stopped by a debugger",
    "D": "it is blocked in the kernel (uninterruptible sleep: a hung disk or network file system?)",
}


@dataclass
class ProcessView:
    """What the monitor knows of one launched process: its last heartbeat and its last sign of life."""

    record: dict[str, Any]
    beat: tuple[Any, int] = (None, 0)  # (beat number, file mtime): a change is a sign of life
    alive_at: float = 0.0  # monotonic time of the last sign of life
    cpu_at: float = 0.0  # CPU seconds used by then
    io_at: int = 0  # bytes read + written by then
    start_time: str = ""  # /proc start time: a reused pid is not this process
    state: str = "?"
    ended: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def _proc(pid: int) -> tuple[str, float, str] | None:
    """(state letter, CPU seconds, start time) of a live process; None when it has ended (or is a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return fields[0], (int(fields[11]) + int(fields[12])) / _TICKS, fields[19]


def _io(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/io", encoding="ascii") as handle:
            counters = dict(line.split(":", 1) for line in handle if ":" in line)
        return int(counters.get("rchar", 0)) + int(counters.get("wchar", 0))
    except (OSError, ValueError):
        return 0


def _where(record: dict[str, Any]) -> str:
    wait = record.get("wait")
    if not wait:
        return "computing, or waiting where hasten cannot see"
    if wait.get("kind") == "left":
        return f"done ({wait.get('op', 'left the script')})"
    number = f" (collective #{wait['n']})" if wait.get("n") is not None else ""
    return f"waiting in {wait.get('op', '?')} at {wait.get('site', '?')}{number}"


def judge(culprits: list[ProcessView], views: dict[int, ProcessView], world_size: int, now: float) -> str:
    """The one message for frozen `culprits`, with what every other process was doing.

    Example:
        >>> frozen = ProcessView({"rank": 1, "pid": 7, "host": "a"}, state="T", alive_at=0.0)
        >>> waiting = ProcessView({"rank": 0, "pid": 6, "host": "a", "wait": {"kind": "hasten", "n": 3, "op": "gather",
        ...                        "site": "train.py:9"}})
        >>> judge([frozen], {0: waiting, 1: frozen}, 2, now=45.2)  # doctest: +NORMALIZE_WHITESPACE
        'rank 1 of 2 (pid 7 on a) stopped responding: it is stopped (SIGSTOP, or a debugger) and showed no sign of
        life for 45 s; rank 0 was waiting in gather at train.py:9 (collective #3)'
    """
    parts = []
    for view in culprits:
        record = view.record
        how = _STATES.get(view.state, "all its threads are blocked (no CPU used, nothing read or written)")
        parts.append(f"rank {record['rank']} of {world_size} (pid {record['pid']} on {record['host']}) stopped "
                     f"responding: {how} and showed no sign of life for {now - view.alive_at:.0f} s")
    blamed = {id(view) for view in culprits}
    others = []
    for rank, view in sorted(views.items()):
        if id(view) in blamed:
            continue
        verb = "ended while" if view.ended else "was"
        others.append(f"rank {rank} {verb} {_where(view.record)}")
    return "; ".join(parts) + ("; " + ", ".join(others) if others else "")


class Monitor:
    """The monitor thread of one attempt: reads the heartbeats in `directory`; `verdict` is its message, if any.

    Example:
        >>> import tempfile
        >>> with Monitor(tempfile.mkdtemp(), limit=45.0, world_size=2) as monitor:
        ...     monitor.verdict is None
        True
    """

    def __init__(self, directory: str, limit: float, world_size: int) -> None:
        self.directory, self.limit, self.world_size = directory, limit, world_size
        self.views: dict[int, ProcessView] = {}
        self.verdict: str | None = None
        self.frozen: tuple[int, ...] = ()  # the ranks the verdict names
        self._kill_at: float | None = None
        self._last_look: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hasten-liveness", daemon=True)

    def __enter__(self) -> "Monitor":
        if self.limit > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.verdict is not None:
            self._kill_all()  # nothing of a frozen run outlives the launcher

    def _run(self) -> None:
        while not self._stop.wait(LOOK_EVERY):
            with contextlib.suppress(Exception):  # a look that fails is retried; the run is never harmed
                self.look(time.monotonic())

    def look(self, now: float) -> None:
        """One look at every process: update the signs of life; decide, kill and keep the verdict when one froze."""
        if self._last_look is not None and now - self._last_look > self.limit / 2 + 2 * LOOK_EVERY:
            for view in self.views.values():  # this launcher was suspended: nobody was watched meanwhile
                view.alive_at = now
        self._last_look = now
        for path in glob.glob(os.path.join(self.directory, "rank-*.json")):
            record = read_heartbeat(path)
            if record is None or not isinstance(record.get("rank"), int):
                continue
            with contextlib.suppress(OSError):
                self._update(record, os.stat(path).st_mtime_ns, now)
        if self._kill_at is not None:
            if now >= self._kill_at:
                self._kill_all()
            return
        frozen = [v for v in self.views.values() if not v.ended and now - v.alive_at >= self.limit]
        if not frozen and any(v.ended for v in self.views.values()):
            frozen = [v for v in self.views.values()
                      if not v.ended and v.state in ("T", "t") and now - v.alive_at >= BLAME_AFTER]
        if frozen:
            self.verdict = judge(frozen, self.views, self.world_size, now)
            self.frozen = tuple(sorted(view.record["rank"] for view in frozen))
            for view in frozen:
                self._kill(view)
            self._kill_at = now + KILL_AFTER

    def _update(self, record: dict[str, Any], mtime: int, now: float) -> None:
        rank, pid = record["rank"], record.get("pid")
        if not isinstance(pid, int):
            return
        view = self.views.get(rank)
        if view is None or view.record.get("pid") != pid:  # a new process (a restart of the group)
            view = self.views[rank] = ProcessView(record, alive_at=now)
        state = _proc(pid)
        if state is None or (view.start_time and state[2] != view.start_time):
            view.ended = True
            return
        view.state, cpu, view.start_time = state[0], state[1], state[2]
        beat = (record.get("beat"), mtime)
        if beat != view.beat:
            view.record, view.beat = record, beat
            view.alive_at, view.cpu_at, view.io_at = now, cpu, _io(pid)
            return
        silent = now - view.alive_at
        if silent < min(self.limit, BLAME_AFTER) or view.state in ("T", "t"):
            return
        io = _io(pid)
        if cpu - view.cpu_at >= CPU_SHARE * silent or io - view.io_at >= IO_BYTES:
            view.alive_at, view.cpu_at, view.io_at = now, cpu, io  # busy with the GIL held: alive, not frozen

    def _kill(self, view: ProcessView) -> None:
        pid = view.record["pid"]  # an int: records without one are never kept
        state = _proc(pid)
        if state is not None and state[2] == view.start_time:  # still the same process (pids are reused)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def kill_all(self) -> None:
        """End every process this monitor has seen (the launcher is stopping this machine's part of the run)."""
        with contextlib.suppress(Exception):
            self.look(time.monotonic())  # processes started since the last look
        self._kill_all()

    def kill_round(self, round_: str, before: Callable[[], None] = lambda: None) -> int:
        """End this machine's processes of one round of an elastic run (another machine of it went silent), calling
        `before` first if any is still running; how many were.

        Example:
            >>> import tempfile
            >>> Monitor(tempfile.mkdtemp(), limit=45.0, world_size=2).kill_round("10.0.0.1:41234")
            0
        """
        with contextlib.suppress(Exception):
            self.look(time.monotonic())  # processes started since the last look
        running = [view for view in list(self.views.values())
                   if view.record.get("round") == round_ and not view.ended and _proc(view.record["pid"]) is not None]
        if running:
            before()
        for view in running:
            self._kill(view)
        return len(running)

    def _kill_all(self) -> None:
        for view in list(self.views.values()):  # (also called from other threads: the store and peer watches)
            self._kill(view)
