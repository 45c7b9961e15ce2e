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

from .failures import all_failures, failure_summary, root_cause
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
        # The agent reports only the failures it saw first; the error files of the attempt hold them all.
        failures = all_failures(failed.failures, log_dir, first_rank=plan.machine_rank * plan.processes_per_machine)
        _, failure = root_cause(failures)
        sys.stderr.write(failure_summary(failures, plan.num_processes) + "\n")
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
    """A `preexec_fn` that makes the child (mpirun) get SIGTERM when this launcher dies (Linux; None elsewhere)."""
    from .lifetime import arm_parent_death_signal, parent_death_signal_available

    if not parent_death_signal_available():  # also loads libc here, before the fork
        return None
    parent = os.getpid()
    return lambda: arm_parent_death_signal(parent)
