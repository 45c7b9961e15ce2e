"""Carrying out a launch plan: in this process for one rank, through torch.distributed.run for several."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any

from .plan import LaunchPlan

__all__ = ["execute"]


def execute(plan: LaunchPlan) -> int:
    """Start the plan's processes, wait for them, and return the exit code for the shell.

    When a rank fails, the others are stopped and one line names the rank
    that failed first and why (its traceback was printed by the rank itself).
    Ctrl-C / SIGTERM reach every process; none is left behind.
    """
    env = plan.worker_env()
    os.environ.clear()
    os.environ.update(env)
    if plan.mode == "single":
        from .worker import main as worker_main

        return worker_main(plan.worker_argv())
    if plan.mode == "mpirun":
        return run_forwarding_signals(plan.command())
    return _run_torchrun(plan)


def _run_torchrun(plan: LaunchPlan) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    # The agent's own per-failure log lines would bury our one-line summary.
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    if plan.quiet:
        logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
    # torchrun keeps per-run error files in a directory it never removes; give it one we do.
    log_dir = tempfile.mkdtemp(prefix="hasten-launch-")
    try:
        run(parse_args([f"--log-dir={log_dir}", *plan.torchrun_argv()]))
    except ChildFailedError as failed:
        _, failure = root_cause(failed.failures)
        sys.stderr.write(failure_summary(failed.failures, plan.num_processes) + "\n")
        code = failure.exitcode
        return code if 0 < code < 256 else 1
    except SignalException as stopped:
        sys.stderr.write(f"hasten launch: stopped by {signal.Signals(stopped.sigval).name}; all processes were ended.\n")
        return 128 + int(stopped.sigval)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    return 0


def run_forwarding_signals(command: list[str]) -> int:
    """Run a launcher subprocess (e.g. mpirun), passing Ctrl-C / SIGTERM on to it; returns a shell exit code.

    The subprocess also gets SIGTERM from Linux if this process dies without
    forwarding anything (SIGKILL, OOM killer): mpirun then stops its ranks
    instead of running on as an orphan.
    """
    process = subprocess.Popen(command, preexec_fn=_terminate_with_parent())
    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    received: list[int] = []

    def forward(sig: int, _frame: Any) -> None:
        received.append(sig)
        process.send_signal(sig)

    previous = {sig: signal.signal(sig, forward) for sig in forwarded}
    try:
        code = process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:  # mpirun reports a forwarded signal as a plain exit 1; say what happened
        sig = received[0]
        sys.stderr.write(f"hasten launch: stopped by {signal.Signals(sig).name}; all processes were ended.\n")
        return 128 + int(sig)
    return 128 - code if code < 0 else code


def _terminate_with_parent():
    """A `preexec_fn` that sets PR_SET_PDEATHSIG=SIGTERM in the child (Linux; None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before fork: the child only calls it
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def set_death_signal() -> None:
        prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return set_death_signal


def root_cause(failures: dict[int, Any]) -> tuple[int, Any]:
    """The failure that caused the others.

    torchrun records the ranks it stopped (SIGTERM, no error file) and the
    ranks that lost a peer as failures too, often within the same second
    as the real one; those rank last, then earlier timestamps first.
    """
    from .worker import is_peer_lost

    def collateral(item: tuple[int, Any]) -> tuple[bool, bool, float, int]:
        rank, failure = item
        stopped = getattr(failure, "exitcode", 1) == -signal.SIGTERM
        return stopped, is_peer_lost(_message(failure)), getattr(failure, "timestamp", 0), rank

    return min(failures.items(), key=collateral)


def _message(failure: Any) -> str:
    message = getattr(failure, "message", "")
    if isinstance(message, dict):  # torchelastic's error-file layout
        message = message.get("message", "")
    return str(message or "")


def failure_summary(failures: dict[int, Any], world_size: int) -> str:
    """One line for the terminal: which rank failed first and why, and what happened to the others."""
    rank, failure = root_cause(failures)
    exitcode = getattr(failure, "exitcode", 1)
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        reason = f"was killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    else:
        reason = f"exited with code {exitcode}"
    message = _message(failure)
    if message and not message.startswith(("To enable traceback", "Signal ")):
        reason = f"failed with {message.splitlines()[0]} (traceback above)"
    others = [r for r in failures if r != rank]
    from .worker import is_peer_lost

    stopped = [r for r in others
               if getattr(failures[r], "exitcode", 0) == -signal.SIGTERM or is_peer_lost(_message(failures[r]))]
    tail = ""
    if len(stopped) == len(others) and others:
        tail = "; the other ranks were stopped"
    elif others:
        tail = f"; {len(others)} other rank(s) ended too: {', '.join(map(str, sorted(others)))}"
    return f"hasten launch: rank {rank} of {world_size} {reason}{tail}."
