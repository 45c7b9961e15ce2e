"""The launcher's guardian: a small process that ends the ranks of a launcher killed hard, stopped ones too.

Each rank gets SIGTERM from Linux when its launcher dies (`process.lifetime`),
even by SIGKILL. A rank that is *stopped* at that moment (SIGSTOP, a
debugger, a paused container) holds the signal pending until it is
continued, which nobody would ever do: it would stay stopped forever,
holding its memory (and a GPU). So `hasten launch` starts this guardian in
a session of its own, beside each attempt. Twice a second it notes the
ranks' pids from their heartbeat files (with their start times, so a reused
pid is never touched) and looks whether the launcher is still there. When
the launcher is gone, it continues every rank still alive (SIGCONT: the
pending SIGTERM is then delivered, and a rank may still save and leave),
gives them `GRACE` seconds, kills those left with SIGKILL and ends. When the
launcher ends the attempt itself, it stops the guardian (`stop`).

It imports nothing heavy (no torch): it costs a few megabytes and a stat
of a handful of files twice a second.

Example:
    >>> guardian = start(os.getpid(), "/nonexistent")  # doctest: +SKIP
    >>> stop(guardian)  # doctest: +SKIP
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

__all__ = ["start", "stop", "watch", "GRACE"]

GRACE = 10.0  # seconds between SIGCONT (the pending SIGTERM) and SIGKILL
LOOK_EVERY = 0.5


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (None when it is gone or a zombie): its identity with `pid`."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def _ranks(directory: str) -> list[int]:
    pids = []
    for path in glob.glob(os.path.join(directory, "rank-*.json")):
        try:
            with open(path) as handle:
                pids.append(int(json.load(handle)["pid"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being rewritten: read it on the next look
    return pids


def watch(launcher: int, directory: str, grace: float = GRACE, look_every: float = LOOK_EVERY) -> list[int]:
    """Wait for `launcher` to die, then end every rank seen in `directory`; returns the pids that needed SIGKILL."""
    launcher_started = start_time(launcher)
    seen: dict[int, str] = {}
    while launcher_started is not None and start_time(launcher) == launcher_started:
        for pid in _ranks(directory):
            if pid not in seen and (started := start_time(pid)) is not None:
                seen[pid] = started
        time.sleep(look_every)
    alive = [pid for pid, started in seen.items() if start_time(pid) == started]
    for pid in alive:
        _signal(pid, signal.SIGCONT)  # the SIGTERM Linux sent at the launcher's death is delivered now
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(start_time(pid) == seen[pid] for pid in alive):
        time.sleep(0.1)
    left = [pid for pid in alive if start_time(pid) == seen[pid]]
    for pid in left:
        _signal(pid, signal.SIGKILL)
    return left


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def start(launcher: int, directory: str) -> subprocess.Popen | None:
    """Start the guardian of `launcher`'s ranks (those writing heartbeats into `directory`); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    return subprocess.Popen([sys.executable, "-m", "hasten.launch.guardian", str(launcher), directory],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # its own session: a signal to the launcher's group spares it


def stop(guardian: subprocess.Popen | None) -> None:
    """The launcher ended the attempt itself: the guardian has nothing left to do."""
    if guardian is not None and guardian.poll() is None:
        guardian.kill()
        guardian.wait()


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.argv[2])
