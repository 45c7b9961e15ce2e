"""What every multi-process benchmark does to start itself: `hasten launch` on 2 processes, one thread each."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def launch_self(script: str, *args: str, launch_args: tuple[str, ...] = (), check: bool = False,
                env: dict[str, str] | None = None) -> int:
    """Run `script` with `args` in 2 processes through `hasten launch` (extra `env` on top); returns the exit status."""
    command = [sys.executable, "-m", "hasten", "launch", "--num_processes", "2", *launch_args,
               str(Path(script).resolve()), *args]
    return subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, cwd=ROOT, check=check).returncode


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (from /proc; Linux), including those that left its session."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL the process `pid` started in a session of its own, its session, and every process below it.

    Launchers such as torchrun put their workers in sessions of their own: killing the launcher's
    session alone would leave them running (and holding the output pipes open).
    """
    below = descendants(pid)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for child in below:
        try:
            os.kill(child, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
