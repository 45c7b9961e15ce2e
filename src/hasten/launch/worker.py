"""What each launched process runs around the user's code: a script (`main`) or a function (`run_function`).

`hasten launch` starts ``python -m hasten.launch.worker [--module] TARGET ARGS...``
on every rank instead of the script itself; `notebook_launcher` forks
processes that call `run_function`. Either way, whatever the user's code
does, each rank

- reports a crash with its rank in the terminal and in torchelastic's
  error file (the launcher then names the failed rank), and
- leaves the process group cleanly on success (barrier + destroy), which
  gloo needs to avoid SIGABRT at interpreter exit, and
- renews a heartbeat file from a thread of its own, so the launcher tells
  a frozen rank from a busy one (`hasten.process.heartbeat`).

The means (`hasten.process`) are shared with every launched process; this
module only decides when to use them.
"""

from __future__ import annotations

import contextlib
import gc
import os
import runpy
import signal
import sys
from typing import Any, Callable

from ..process.aliasing import install as install_accelerate_switch
from ..process.launch_spec import (AS_ACCELERATE_ENV, EXIT_FAILED, EXIT_INTERRUPTED, PREEMPTION_RECORD_ENV, SPEC_ENV_VAR,
                                   LaunchSpec)
from ..process.exit import exit_cleanly, exit_now, hide_frames_of, rank_label, record_failure
from ..process import board, heartbeat
from ..process.group import leave_process_group
from ..process.lifetime import die_with_launcher

__all__ = ["main", "run_function", "export_peer_environment", "run_target"]

hide_frames_of(__file__)  # reports start at the user's frame, not this wrapper's

# The agent's handlers, which a forked worker inherits (see `_reset_inherited_signals`).
AGENT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


def run_target(target: str, args: list[str], module: bool = False) -> None:
    """Run a script path or module as ``__main__`` with `args` as its sys.argv[1:]."""
    if module:
        sys.argv = [target, *args]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        runpy.run_path(target, run_name="__main__")


def is_preemption(stop: SystemExit) -> bool:
    preemption = sys.modules.get("hasten.checkpointing.preemption")  # loaded only if the script used it
    return preemption is not None and isinstance(stop, preemption.Preempted)


def export_peer_environment() -> None:
    """Add the variables Accelerate's launcher would export (derived from the launch spec) for the script to read."""
    if os.environ.get(SPEC_ENV_VAR):
        os.environ.update(LaunchSpec.current().peer_env())


def forget_last_round() -> None:
    """An elastic run's new round: the last round's preemption record (its agent stopped it to grow) is not this one's.

    Example:
        >>> forget_last_round()  # no elastic launch here: nothing to forget
    """
    record = os.environ.get(PREEMPTION_RECORD_ENV)
    if record and os.environ.get(SPEC_ENV_VAR) and LaunchSpec.current().elastic is not None:
        with contextlib.suppress(OSError):
            os.unlink(record)


def main(argv: list[str] | None = None, exit_when_done: bool = True) -> int:
    """Run the target on this rank; with `exit_when_done` a finished rank ends through `exit_cleanly`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    die_with_launcher()
    heartbeat.start()  # from the first moment: a process may freeze before the script creates anything
    module = bool(argv) and argv[0] == "--module"
    if module:
        argv = argv[1:]
    if not argv:
        sys.stderr.write("usage: python -m hasten.launch.worker [--module] TARGET [ARGS...]\n")
        return 2
    target, args = argv[0], argv[1:]
    export_peer_environment()
    forget_last_round()
    if os.environ.get(AS_ACCELERATE_ENV) == "1":  # `hasten launch --as-accelerate`: before the script imports anything
        install_accelerate_switch()
    try:
        run_target(target, args, module=module)
    except SystemExit as stop:
        if is_preemption(stop):  # the checkpoint is saved on every rank: leave together, quietly
            board.mark_left()
            leave_process_group(success=True)
            exit_now(int(stop.code or 0))
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if code != 0:
            if not isinstance(stop.code, int):
                sys.stderr.write(f"{stop.code}\n")
            sys.stderr.write(f"[hasten] rank {rank_label()} exited with code {code}\n")
            exit_now(code)
    except KeyboardInterrupt:  # Ctrl-C reaches every rank: one line each, not N tracebacks
        sys.stderr.write(f"[hasten] rank {rank_label()} interrupted.\n")
        exit_now(EXIT_INTERRUPTED)
    except BaseException as error:  # noqa: BLE001 - every failure must be reported with its rank
        record_failure(error)
        exit_now(EXIT_FAILED)
    board.mark_left()  # a process still waiting for this one in a collective is told at once
    leave_process_group(success=True)
    if exit_when_done:
        exit_cleanly(0)
    return 0


def run_function(function: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """What each forked process of `notebook_launcher` runs: the function, then a clean exit from the process group.

    On failure the rank prints its traceback, writes torchelastic's error
    file and exits at once (gloo may abort in interpreter teardown).
    """
    # Everything inherited from the launching process belongs to it: never collect it here.
    # Its garbage may hold objects whose finalizers touch the parent's threads (a torch
    # TCPStore joins its server thread), which a forked worker does not have: SIGSEGV.
    gc.freeze()
    _reset_inherited_signals()
    die_with_launcher()
    heartbeat.start()
    _apply_thread_count()
    export_peer_environment()
    try:
        function(*args)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if code != 0:
            record_failure(stop)
            exit_now(code)
    except BaseException as error:  # noqa: BLE001 - every failure must reach the caller with its rank
        # Called inside this except block: torchelastic's error file takes the traceback of the
        # exception being handled (record_failure drops this wrapper's frames from its top).
        record_failure(error)
        exit_now(EXIT_FAILED)
    board.mark_left(board.LEFT_REASONS.index("returned from the launched function"))
    leave_process_group(success=True, what="returned from the launched function")
    return None  # the agent pickles the return value; None always pickles


def _reset_inherited_signals() -> None:
    """Undo the agent's handlers a forked worker inherited: its signals must end a worker, not raise in it.

    The agent stops workers with SIGTERM, or with the signal it got itself
    (SIGINT when the kernel is interrupted); either ends the worker at once,
    without a misleading "rank R failed with KeyboardInterrupt" report.
    """
    for name in AGENT_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is not None:
            signal.signal(sig, signal.SIG_DFL)


def _apply_thread_count() -> None:
    """A forked worker inherits torch's thread pool size; OMP_NUM_THREADS alone would not change it."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0 and "torch" in sys.modules:
        import torch

        with contextlib.suppress(RuntimeError):
            torch.set_num_threads(int(threads))


if __name__ == "__main__":
    raise SystemExit(main())
