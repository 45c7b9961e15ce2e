"""How a launched process reports a failure and ends.

A failure is reported once, with the rank, in the terminal and in
torchelastic's error file (the launcher then names the rank that failed
first); a rank that only lost a peer says so in one line, keeping the
terminal on the root cause. A failed process ends with ``os._exit``: gloo
may abort in the interpreter's teardown and turn a clean exit code into a
confusing SIGABRT.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
import traceback
from types import TracebackType
from typing import Callable

__all__ = ["PEER_LOST_MARKERS", "is_peer_lost", "hide_frames_of", "is_hidden", "rank_label", "record_failure",
           "exit_now", "exit_cleanly"]

# Errors a healthy rank gets when a peer died: consequences, not causes.
PEER_LOST_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "NCCL communicator was aborted",
)

# Files whose frames a report leaves out: runpy's, and the per-rank wrapper's (it adds itself).
_HIDDEN_FILES = {os.path.abspath(runpy.__file__), "<frozen runpy>"}


def is_peer_lost(message: str) -> bool:
    """True if an error message says a peer process went away (so it is not the root cause).

    Example:
        >>> is_peer_lost("RuntimeError: Connection closed by peer [127.0.0.1]:29500")
        True
    """
    return any(marker in message for marker in PEER_LOST_MARKERS)


def hide_frames_of(path: str) -> None:
    """Leave the frames of the file `path` out of failure reports and stacks (a wrapper around the user's code).

    Example:
        >>> is_hidden("<frozen runpy>")  # runpy's frames are always left out
        True
    """
    _HIDDEN_FILES.add(os.path.abspath(path))


def is_hidden(filename: str) -> bool:
    """Whether frames of `filename` are left out of reports (see `hide_frames_of`)."""
    return filename in _HIDDEN_FILES or os.path.abspath(filename) in _HIDDEN_FILES


def _user_traceback(tb: TracebackType | None) -> TracebackType | None:
    """Drop the wrapper's and runpy's own frames from the top of a traceback."""
    while tb is not None and is_hidden(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb


def rank_label() -> str:
    """This process's rank as text ("?" when the environment names none it can read).

    Example:
        >>> rank_label()
        '0'
    """
    from .topology import ProcessTopology  # torch-free: works under torchrun, MPI and SLURM

    try:
        return str(ProcessTopology.from_env().rank)
    except ValueError:
        return os.environ.get("RANK", "?")


_failure_hooks: list[Callable[[], None]] = []


def on_failure(hook: Callable[[], None]) -> Callable[[], None]:
    """Call `hook()` when this process fails (before its report); a hook that raises is skipped. Returns `hook`.

    For what only a failing process knows and a restarted run needs (an
    elastic run records how far it got, to tell the steps it redoes).

    Example:
        >>> _ = on_failure(lambda: None); _failure_hooks.clear()
    """
    _failure_hooks.append(hook)
    return hook


def record_failure(error: BaseException) -> None:
    """Report `error` with this process's rank: in the terminal and in torchelastic's error file (when there is one)."""
    for hook in list(_failure_hooks):
        with contextlib.suppress(Exception):
            hook()
    error.__traceback__ = _user_traceback(error.__traceback__)
    if is_peer_lost(str(error)):
        # Keep the terminal on the root cause: one line for the collateral failure.
        sys.stderr.write(f"[hasten] rank {rank_label()} stopped: another process of the run went away "
                         f"({type(error).__name__}).\n")
    else:
        header = f"[hasten] rank {rank_label()} failed with {type(error).__name__}: {error}"
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        sys.stderr.write(f"{header}\n{text}")
    if os.environ.get("TORCHELASTIC_ERROR_FILE"):
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        handler = get_error_handler()
        handler.initialize()
        handler.record_exception(error)


def exit_now(code: int) -> None:
    """End this process at once with `code`, skipping the interpreter's teardown (gloo may abort in it)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def exit_cleanly(code: int = 0) -> None:
    """End a finished rank as the interpreter would, but skip its C++ teardown.

    At interpreter teardown, C++ objects that a gloo process group leaves
    behind (a group the script still references after destroy_process_group,
    say) are destroyed in no fixed order, and now and then one of them is a
    still-joinable thread: "terminate called without an active exception",
    SIGABRT, after all the work was done. So a finished rank does what
    teardown would do for the user — wait for non-daemon threads, run the
    atexit handlers, flush every open file — and then leaves with
    ``os._exit``: the same result, every time.

    Example (a pool's worker thread is not a daemon; it finishes at exit, as it would without hasten):
        >>> import subprocess, sys
        >>> code = ("from concurrent.futures import ThreadPoolExecutor; from hasten.process.exit import exit_cleanly; "
        ...         "pool = ThreadPoolExecutor(1); pool.submit(print, 'done').result(); exit_cleanly(3)")
        >>> result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        >>> result.returncode, result.stdout
        (3, 'done\\n')
    """
    import atexit
    import gc
    import io
    import threading

    # as the interpreter does, threading's own exit callbacks come first, then the join: concurrent.futures tells its
    # pool workers to finish there (torchft's manager keeps one; joined before, a live run's end waited forever)
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None and threading.current_thread() is threading.main_thread():
        shutdown()
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # prints (does not raise) the errors of failing handlers, as at a normal exit
    for obj in gc.get_objects():
        if issubclass(type(obj), io.IOBase):  # type(), not isinstance: no __class__ property is run
            try:
                if not obj.closed and obj.writable():
                    obj.flush()
            except Exception:  # noqa: BLE001 - a broken file must not turn a finished run into a failure
                pass
    exit_now(code)
