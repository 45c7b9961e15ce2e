"""Carrying out a launch plan: in this process for one rank, through torch.distributed.run for several."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any

from .. import host_board
from ..checkpointing.preemption import EXIT_PREEMPTED, PROGRESS_ENV, RECORD_ENV, read_preemption_record
from .failures import all_failures, failure_summary, root_cause
from .leftovers import owned_directory
from .plan import LaunchPlan

__all__ = ["execute"]


def execute(plan: LaunchPlan) -> int:
    """Start the plan's processes, wait for them, and return the exit code for the shell.

    When a rank fails, the others are stopped and one line names the rank
    that failed first and why (its traceback was printed by the rank itself).
    Ctrl-C / SIGTERM reach every process; none is left behind. A run that
    saved a preemption checkpoint ends with one line saying where, and
    `EXIT_PREEMPTED`.
    """
    env = plan.worker_env()
    os.environ.clear()
    os.environ.update(env)
    os.environ.pop(host_board.BOARD_DIR_ENV, None)  # a launch inside a launched process gets its own board or none
    run_dir = owned_directory("launch")  # a SIGKILLed launcher's is removed by the next launch
    os.environ[RECORD_ENV] = os.path.join(run_dir, "preempted.json")
    try:
        if plan.mode == "single":
            from .worker import main as worker_main

            return _preempted_or(worker_main(plan.worker_argv(), exit_when_done=False))
        if plan.mode == "mpirun":
            return _preempted_or(run_forwarding_signals(plan.command()))
        if plan.num_machines > 1:
            return _run_torchrun(plan, run_dir, board_dir=None)
        with host_board.shared_directory() as board_dir:
            return _run_torchrun(plan, run_dir, board_dir)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _preempted_or(code: int) -> int:
    """`EXIT_PREEMPTED` with one line when the run saved a preemption checkpoint, else `code`."""
    message = read_preemption_record(os.environ[RECORD_ENV])
    if message is None:
        return code
    sys.stderr.write(f"hasten launch: {message}.\n")
    return EXIT_PREEMPTED


def _run_torchrun(plan: LaunchPlan, run_dir: str, board_dir: str | None) -> int:
    """torchrun, restarted here (one machine) only after an attempt that made progress; see `LaunchPlan.restarts_by_launcher`."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    # The agent's own per-failure log lines would bury our one-line summary.
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    # "Received 15 death signal, shutting down workers": we print our own line about the signal.
    logging.getLogger("torch.distributed.elastic.agent.server.api").setLevel(logging.ERROR)
    if plan.quiet:
        logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
    progress = os.path.join(run_dir, "progress")
    os.environ[PROGRESS_ENV] = progress
    restarts_left = plan.restarts_by_launcher
    attempt = 0
    while True:
        attempt += 1
        with contextlib.suppress(FileNotFoundError):
            os.unlink(progress)
        if board_dir is not None:
            host_board.empty(board_dir)  # the words of a failed attempt must not meet the next one's
        # The script sees TORCHELASTIC_RESTART_COUNT count this launcher's restarts too (as under torchrun's own).
        os.environ.update(dataclasses.replace(plan.spec, restart_count=attempt - 1,
                                              max_restarts=plan.restarts_by_launcher).to_env())
        # torchrun keeps per-run error files in a directory it never removes; give it one we do.
        log_dir = tempfile.mkdtemp(prefix="attempt-", dir=run_dir)
        try:
            run(parse_args([f"--log-dir={log_dir}", *plan.torchrun_argv()]))
        except ChildFailedError as failed:
            # The agent reports only the failures it saw first; the error files of the attempt hold them all.
            failures = all_failures(failed.failures, log_dir, first_rank=plan.machine_rank * plan.processes_per_machine)
            _, failure = root_cause(failures)
            code = failure.exitcode if 0 < failure.exitcode < 256 else 1
            if read_preemption_record(os.environ[RECORD_ENV]) is not None:
                return _preempted_or(code)
            sys.stderr.write(failure_summary(failures, plan.num_processes) + "\n")
            if restarts_left > 0 and os.path.exists(progress):
                restarts_left -= 1
                sys.stderr.write(f"hasten launch: restarting every process (attempt {attempt + 1}, "
                                 f"{restarts_left} restart(s) left after it).\n")
                continue
            if restarts_left > 0:
                sys.stderr.write("hasten launch: not restarting: this attempt failed before its first training batch "
                                 "was done, so a restart would fail the same way.\n")
            return code
        except SignalException as stopped:
            if read_preemption_record(os.environ[RECORD_ENV]) is not None:
                return _preempted_or(128 + int(stopped.sigval))
            sys.stderr.write(f"hasten launch: stopped by {signal.Signals(stopped.sigval).name}; all processes were ended.\n")
            return 128 + int(stopped.sigval)
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
