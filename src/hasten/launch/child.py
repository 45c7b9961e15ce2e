"""A launcher's one child process (`accelerate launch` of one process): its stderr's tail kept, stopped as a tree.

Accelerate 1.16's launcher runs the training script as a child, writes the
child's stderr through as it arrives while keeping its last 512 KiB for the
error it raises, and on Ctrl-C or SIGTERM stops the child *and everything
the child started* (workers in sessions of their own included), then exits
130 (128 + the signal). `run_child` does that and reports a `ChildRun`; the
front decides what to raise or exit with.

Example:
    >>> import sys
    >>> run = run_child([sys.executable, "-c", "import sys; sys.stderr.write('why'); sys.exit(3)"])  # 'why' shown
    >>> run.code, run.stderr_tail, run.signum
    (3, 'why', None)
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections import deque
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import psutil

__all__ = ["CHILD_STDERR_CHUNK_SIZE", "CHILD_STDERR_TAIL_CHUNKS", "ChildRun", "LIVE_STOP_GRACE", "STOP_GRACE", "run_child",
           "terminate_tree"]

# What is kept of the child's stderr for the error: the last CHUNK_SIZE x TAIL_CHUNKS bytes (512 KiB), read in chunks.
CHILD_STDERR_CHUNK_SIZE = 8192
CHILD_STDERR_TAIL_CHUNKS = 64
STOP_GRACE = _GRACE = 5.0  # seconds a stopped tree has after SIGTERM before SIGKILL
# a live machine's worker leaves at the end of its step: as long as torch's agent gives its workers after a stop
LIVE_STOP_GRACE = 30.0


@dataclass
class ChildRun:
    """How the child ended: its exit code for the shell, the tail of its stderr, the signal that stopped it (if any).

    Example:
        >>> ChildRun(code=0).signum is None
        True
    """

    code: int
    stderr_tail: str = ""
    signum: int | None = None


class _Stopped(SystemExit):
    """SIGTERM (or SIGHUP) reached the launcher: leave the wait with 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


def _stop(signum: int, _frame: Any) -> None:
    raise _Stopped(signum)


def terminate_tree(process: Any, grace: float = _GRACE) -> None:
    """SIGTERM `process` and every descendant (found before the parent goes), SIGKILL what is left after `grace` s.

    Example:
        >>> import subprocess, sys, psutil
        >>> child = psutil.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        >>> terminate_tree(child)
        >>> child.poll() is not None
        True
    """
    processes = [process]
    with suppress(psutil.NoSuchProcess):
        processes.extend(process.children(recursive=True))
    alive = processes
    try:
        for each in processes:
            with suppress(psutil.NoSuchProcess):
                each.terminate()
        _, alive = psutil.wait_procs(processes, timeout=grace)
    except (KeyboardInterrupt, SystemExit):  # a second Ctrl-C: go straight to SIGKILL
        pass
    finally:
        for each in alive:
            with suppress(psutil.NoSuchProcess):
                each.kill()
        psutil.wait_procs(alive, timeout=_GRACE)
        process.wait()


def run_child(command: Sequence[str], env: Mapping[str, str] | None = None,
              preexec_fn: Callable[[], Any] | None = None, grace: float = _GRACE) -> ChildRun:
    """Run `command`, writing its stderr through and keeping the tail; Ctrl-C / SIGTERM stop its whole tree.

    Returns the exit code (128 + N for a child killed by signal N); stopped by a signal, the code is 128 + that
    signal (130 for Ctrl-C) and `signum` names it. Another `SystemExit` raised meanwhile stops the tree too, and
    is raised again. `grace`: the seconds a stopped tree has before SIGKILL (a live worker finishes its step).
    """
    process = psutil.Popen(list(command), env=None if env is None else dict(env), stderr=subprocess.PIPE,
                           preexec_fn=preexec_fn)
    tail: deque[bytes] = deque(maxlen=CHILD_STDERR_TAIL_CHUNKS)
    out = getattr(sys.stderr, "buffer", None)

    def copy_stderr() -> None:
        while chunk := process.stderr.read1(CHILD_STDERR_CHUNK_SIZE):
            if out is not None:
                out.write(chunk)
            else:
                sys.stderr.write(chunk.decode(errors="replace"))
            sys.stderr.flush()
            tail.append(chunk)

    reader: threading.Thread | None = None
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        copy_stderr()
        code = process.wait()
    except (KeyboardInterrupt, SystemExit) as stop:
        # Keep draining while the tree stops, so a child writing its last words cannot block on a full pipe.
        reader = threading.Thread(target=copy_stderr, daemon=True)
        reader.start()
        terminate_tree(process, grace)
        reader.join(timeout=_GRACE)
        if isinstance(stop, SystemExit) and not isinstance(stop, _Stopped):
            raise
        signum = stop.signum if isinstance(stop, _Stopped) else int(signal.SIGINT)
        return ChildRun(code=128 + signum, stderr_tail=_text(tail), signum=signum)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if reader is None or not reader.is_alive():  # a descendant may still hold the pipe: never block closing it
            process.stderr.close()
    return ChildRun(code=128 - code if code < 0 else code, stderr_tail=_text(tail))


def _text(tail: deque[bytes]) -> str:
    return b"".join(tail).decode(errors="replace")
