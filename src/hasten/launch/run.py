"""Carrying out a launch plan, for `hasten launch` and `notebook_launcher` alike.

`launch(plan)` sets up what every launch needs once — the workers'
environment (put back afterwards), a run directory (error files, the
progress file, the preemption record; a SIGKILLed launcher's is removed by
the next launch), the board directory of one machine's processes — then
starts the processes: in this process for one rank, through mpirun, or
through torch's elastic agent, restarting the group on one machine only
after an attempt that made progress. A `notebook_launcher` plan of one
process is the exception: its function is simply called here, with the
launch spec set, as Accelerate calls it without any launch. It returns an
`Outcome`; each front presents it in its own way (`execute`: lines and an
exit code for the shell; `notebook_launcher`: an exception for the caller).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..checkpointing.preemption import read_preemption_record
from ..core.environment import restored_environment
from ..process.launch_spec import (BOARD_DIR_ENV, EXIT_FAILED, EXIT_PREEMPTED, HEARTBEAT_DIR_ENV, PREEMPTION_RECORD_ENV,
                           PROGRESS_FILE_ENV, LaunchSpec)
from .elastic import LEAVE_GRACE, StoreWatch, is_store_lost, store_lost
from .failures import all_failures, failure_summary
from .child import LIVE_STOP_GRACE, STOP_GRACE, run_child
from .leftovers import empty, owned_directory, shared_directory
from .guardian import start as guardian_of, stop as stop_guardian
from .liveness import Monitor
from .network import is_loopback, local_address_for
from .peer_watch import PeerWatch
from .plan import LaunchPlan
from .worker import AGENT_SIGNALS

__all__ = ["Outcome", "launch", "execute", "execute_outcome", "run_forwarding_signals"]

# The agent's own log lines (per-failure tracebacks, "closing process ...") would bury the one
# summary `hasten launch` prints; "Received 15 death signal, shutting down workers": it prints its own line.
_LAUNCH_LOG_LEVELS = {
    "torch.distributed.elastic.multiprocessing.api": logging.CRITICAL,
    "torch.distributed.elastic.agent.server.api": logging.ERROR,
}
# ... or the one exception `notebook_launcher` raises.
_NOTEBOOK_LOG_LEVELS = {
    "torch.distributed.elastic": logging.ERROR,
    "torch.distributed.elastic.multiprocessing.api": logging.CRITICAL,
    "torch.distributed.elastic.multiprocessing.errors": logging.CRITICAL,
    "torch.distributed.elastic.agent.server.api": logging.CRITICAL,
    "torch.distributed.elastic.agent.server.local_elastic_agent": logging.CRITICAL,
    "torch.distributed.launcher.api": logging.CRITICAL,
    "torch.multiprocessing.spawn": logging.ERROR,
}


@dataclasses.dataclass
class Outcome:
    """How a launch ended.

    Example:
        >>> Outcome().code
        0
    """

    code: int = 0  # the exit code for the shell
    failures: dict[int, Any] = dataclasses.field(default_factory=dict)  # every failure of the last attempt, by rank
    reported: dict[int, Any] = dataclasses.field(default_factory=dict)  # the failures the agent itself reported
    preempted: str | None = None  # the line for a run that saved a preemption checkpoint
    signum: int | None = None  # the signal that ended the run (the agent stopped every process)
    restarts_declined: bool = False  # restarts were left, but the attempt failed before its first training batch
    unresponsive: str | None = None  # a process froze: the line naming it (`hasten.launch.liveness`)
    lost: str | None = None  # an elastic run lost its rendezvous store: the line saying so (`launch.elastic`)
    frozen: tuple[int, ...] = ()  # ... and the ranks that froze
    stderr_tail: str = ""  # a child run's (`accelerate launch` of one process): the last 512 KiB of its stderr

    def summary(self, world_size: int) -> str:
        """The line that says why the run failed: the frozen process, else the root cause among the failures."""
        return (self.lost or self.unresponsive
                or failure_summary(self.failures, world_size).removeprefix("hasten launch: "))


def execute(plan: LaunchPlan) -> int:
    """`hasten launch`: start the plan's processes, wait for them, and return the exit code for the shell.

    When a rank fails, the others are stopped and one line names the rank
    that failed first and why (its traceback was printed by the rank itself).
    Ctrl-C / SIGTERM reach every process; none is left behind. A run that
    saved a preemption checkpoint ends with one line saying where, and
    `EXIT_PREEMPTED`.
    """
    return execute_outcome(plan).code


def execute_outcome(plan: LaunchPlan) -> Outcome:
    """`execute`, returning the whole `Outcome` (`accelerate launch` raises from it in Accelerate's way)."""
    outcome = launch(plan)
    if outcome.preempted is not None:
        sys.stderr.write(f"hasten launch: {outcome.preempted}.\n")
    elif outcome.failures or outcome.unresponsive or outcome.lost:
        sys.stderr.write(f"hasten launch: {outcome.summary(plan.num_processes)}\n")
        if outcome.restarts_declined:
            sys.stderr.write("hasten launch: not restarting: this attempt failed before its first training batch "
                             "was done, so a restart would fail the same way.\n")
    elif outcome.signum is not None:
        name = signal.Signals(outcome.signum).name
        sys.stderr.write(f"hasten launch: stopped by {name}; all processes were ended.\n")
    return outcome


def launch(plan: LaunchPlan) -> Outcome:
    """Carry out `plan` (see the module doc); this process's environment, signal handlers and log levels are put back.

    Example:
        >>> launch(LaunchPlan(target="print", function=print, function_args=("in this process",))).code
        in this process
        0
    """
    if plan.live:  # machine 0's lighthouse here, then this machine's one process as a local launch
        from .live import run_live

        return run_live(plan, launch)
    if plan.function is not None and plan.mode == "single":
        return _call_here(plan.function, plan.function_args, plan.spec)
    with _patched_environ(plan.worker_env()), _restored_signal_handlers():
        for inherited in (BOARD_DIR_ENV, HEARTBEAT_DIR_ENV):  # a launch inside a launched process: its own or none
            os.environ.pop(inherited, None)
        run_dir = owned_directory("launch")
        record = os.environ[PREEMPTION_RECORD_ENV] = os.path.join(run_dir, "preempted.json")
        try:
            if plan.mode == "single" and not plan.in_this_process:
                live = plan.spec.live is not None  # a live machine's worker: a stop is a leave at its step's end
                with _watched(plan, run_dir, "worker") as monitor:
                    child = run_child(plan.command(), preexec_fn=_terminate_with_parent(),
                                      grace=LIVE_STOP_GRACE if live else STOP_GRACE)
                if child.signum is not None and not (live and read_preemption_record(record)):
                    return Outcome(code=child.code, signum=child.signum, stderr_tail=child.stderr_tail)
                if monitor.verdict is not None and child.code != 0:
                    return Outcome(code=EXIT_FAILED, unresponsive=monitor.verdict, frozen=monitor.frozen,
                                   stderr_tail=child.stderr_tail)
                return _preempted_or(child.code, record, stderr_tail=child.stderr_tail)
            if plan.mode == "single":
                from .worker import main as worker_main

                return _preempted_or(worker_main(plan.worker_argv(), exit_when_done=False), record)
            if plan.mode == "mpirun":
                with _watched(plan, run_dir, "mpirun") as monitor:
                    code = run_forwarding_signals(plan.command())
                if monitor.verdict is not None and code != 0:
                    return Outcome(code=EXIT_FAILED, unresponsive=monitor.verdict, frozen=monitor.frozen)
                return _preempted_or(code, record)
            if plan.num_machines > 1:
                return _run_elastic(plan, run_dir, record, board_dir=None)
            with shared_directory() as board_dir:
                return _run_elastic(plan, run_dir, record, board_dir)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)


def _call_here(function: Callable[..., Any], args: tuple[Any, ...], spec: LaunchSpec) -> Outcome:
    """A function plan of one process: call it in this process; its exceptions reach the caller unchanged.

    Only the spec's variable is set, and put back afterwards; whatever else
    the function sets in os.environ stays, as it would without a launcher.
    """
    (name, value), = spec.to_env().items()
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        function(*args)
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous
    return Outcome()


def _preempted_or(code: int, record: str, **more: Any) -> Outcome:
    """`EXIT_PREEMPTED` with the record's line when the run saved a preemption checkpoint, else `code`."""
    message = read_preemption_record(record)
    if message is None:
        return Outcome(code=code, **more)
    return Outcome(code=EXIT_PREEMPTED, preempted=message, **more)


def _run_elastic(plan: LaunchPlan, run_dir: str, record: str, board_dir: str | None) -> Outcome:
    """torch's elastic agent, restarted here (one machine) only after an attempt that made progress.

    See `LaunchPlan.restarts_by_launcher`; a `notebook_launcher` plan
    leaves its restarts to the agent.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    progress = os.environ[PROGRESS_FILE_ENV] = os.path.join(run_dir, "progress")
    restarts_left = plan.restarts_by_launcher
    attempt = 0
    levels = _NOTEBOOK_LOG_LEVELS if plan.function is not None else _launch_log_levels(plan)
    with _log_levels(levels), contextlib.ExitStack() as stack:  # (stack: each attempt's store watch is stopped)
        while True:
            attempt += 1
            with contextlib.suppress(FileNotFoundError):
                os.unlink(progress)
            if board_dir is not None:
                empty(board_dir)  # the words of a failed attempt must not meet the next one's
            # The script sees TORCHELASTIC_RESTART_COUNT count this launcher's restarts too (as under torchrun's own).
            os.environ.update(dataclasses.replace(plan.spec, restart_count=attempt - 1,
                                                  max_restarts=plan.restarts_by_launcher).to_env())
            # torchrun keeps per-run error files in a directory it never removes; give it one we do.
            if plan.log_dir:  # `--log_dir`: the attempts' folders are kept there (torchrun's logs, error files)
                os.makedirs(plan.log_dir, exist_ok=True)
            log_dir = tempfile.mkdtemp(prefix="attempt-", dir=plan.log_dir or run_dir)
            cut_off = _store_watch(plan)
            if cut_off is not None:
                stack.callback(cut_off.stop)
            peers: PeerWatch | None = None
            try:
                with _watched(plan, run_dir, f"attempt-{attempt}") as monitor:
                    if cut_off is not None:
                        cut_off.on_lost = functools.partial(_leave_run, monitor, cut_off)
                        cut_off.start()
                    peers = _peer_watch(plan, monitor)
                    if peers is not None:
                        stack.callback(peers.stop)
                        peers.start()
                    _run_agent(plan, log_dir)
                    if peers is not None:
                        peers.leave()  # the others need not wait for this machine's heartbeat any more
            except ChildFailedError as failed:
                # The agent reports only the failures it saw first; the error files of the attempt hold them all.
                reported = dict(failed.failures)
                first_rank = next((r - f.local_rank for r, f in reported.items()), plan.machine_rank * plan.processes_per_machine)
                failures = all_failures(reported, log_dir, first_rank)
                # a frozen process (this machine's), else a silent machine (another's) ended the last round
                verdict = monitor.verdict or (peers.verdict if peers is not None else None)
                code = EXIT_FAILED if verdict is not None else _exit_code(failures)
                outcome = Outcome(code, failures=failures, reported=reported, unresponsive=verdict,
                                  frozen=monitor.frozen)
                if read_preemption_record(record) is None and restarts_left > 0 and os.path.exists(progress):
                    restarts_left -= 1
                    sys.stderr.write(f"hasten launch: {outcome.summary(plan.num_processes)}\n")
                    sys.stderr.write(f"hasten launch: restarting every process (attempt {attempt + 1}, "
                                     f"{restarts_left} restart(s) left after it).\n")
                    continue
                return _preempted_or(outcome.code, record, failures=failures, reported=reported,
                                     restarts_declined=restarts_left > 0, unresponsive=verdict,
                                     frozen=monitor.frozen)
            except SignalException as stopped:  # kept as a number: the exception holds the agent's frames
                if cut_off is not None and cut_off.verdict is not None:  # the store watch stopped this machine
                    cut_off.stop()
                    return Outcome(code=EXIT_FAILED, lost=cut_off.verdict)
                return _preempted_or(128 + int(stopped.sigval), record, signum=int(stopped.sigval))
            except Exception as error:  # noqa: BLE001 - only the rendezvous store's loss is ours to explain
                if not (plan.elastic and is_store_lost(error)):
                    raise
                return Outcome(code=EXIT_FAILED, lost=store_lost(plan, error))
            return Outcome()


def _store_watch(plan: LaunchPlan) -> StoreWatch | None:
    """An elastic run's watch of the rendezvous store (None for other runs: their group never re-forms)."""
    if not plan.elastic or plan.main_process_port is None:
        return None
    return StoreWatch(plan.master_addr, int(plan.main_process_port), plan.liveness_timeout, on_lost=lambda line: None)


def _peer_watch(plan: LaunchPlan, monitor: Monitor) -> PeerWatch | None:
    """An elastic run's heartbeat in the rendezvous store and watch of the other machines (None for other runs)."""
    if not plan.elastic or plan.main_process_port is None:
        return None
    address = None if is_loopback(plan.master_addr) else local_address_for(plan.master_addr)
    identity = {"name": f"{socket.gethostname()}/{plan.machine_rank}", "address": address}
    return PeerWatch(plan.master_addr, int(plan.main_process_port), plan.liveness_timeout, monitor.directory,
                     identity, on_silent=functools.partial(_end_for_silent_peer, monitor))


def _end_for_silent_peer(monitor: Monitor, round_: str, line: str) -> bool:
    """A machine of this round went silent: end this machine's processes of the round (they wait for it, or soon
    would), so that torch's agent re-forms the group without it, as after any failure; the line says why."""
    def say() -> None:
        sys.stderr.write(f"hasten launch: {line}.\n")
        sys.stderr.flush()

    # none running: they ended already (the lost machine's closed connections failed them), the group re-forms
    return monitor.kill_round(round_, before=say) > 0


def _leave_run(monitor: Monitor, watch: StoreWatch, line: str) -> None:
    """This machine is cut off from an elastic run: end its processes now, then stop the agent (a SIGTERM to itself,
    which torch's agent turns into its own orderly stop), so the launcher returns with the watch's line. An agent
    blocked on the unreachable store does not get to the signal for minutes: then the launcher leaves by itself."""
    monitor.kill_all()
    os.kill(os.getpid(), signal.SIGTERM)

    def leave_now() -> None:
        sys.stderr.write(f"hasten launch: {line}.\n")
        sys.stderr.flush()
        os._exit(EXIT_FAILED)

    watch.last_resort = threading.Timer(LEAVE_GRACE, leave_now)
    watch.last_resort.daemon = True
    watch.last_resort.start()


@contextlib.contextmanager
def _watched(plan: LaunchPlan, run_dir: str, name: str) -> Iterator[Monitor]:
    """Give the workers a heartbeat directory (a fresh one per attempt) and watch it while the block runs."""
    directory = os.environ[HEARTBEAT_DIR_ENV] = os.path.join(run_dir, f"heartbeats-{name}")
    os.makedirs(directory, exist_ok=True)
    guardian = guardian_of(os.getpid(), directory)  # ends the ranks, stopped ones too, if this launcher is killed
    try:
        with Monitor(directory, plan.liveness_timeout, plan.num_processes) as monitor:
            yield monitor
    finally:
        stop_guardian(guardian)


def _run_agent(plan: LaunchPlan, log_dir: str) -> None:
    """One attempt on torch's elastic agent: torchrun's own `run` for a script, or a notebook plan's function (forked).

    A script goes through ``torch.distributed.run.run`` (looked up when called), as Accelerate's launcher does.
    """
    import torch.distributed.run as torchrun

    args = torchrun.parse_args([f"--log-dir={log_dir}", *plan.torchrun_argv()])
    if plan.function is None:
        torchrun.run(args)
        return
    from torch.distributed.launcher.api import elastic_launch

    from .worker import run_function

    config, _, _ = torchrun.config_from_args(args)
    elastic_launch(dataclasses.replace(config, **plan.elastic_settings()), run_function)(
        plan.function, tuple(plan.function_args))


def _exit_code(failures: Mapping[int, Any]) -> int:
    from .failures import root_cause

    _, failure = root_cause(dict(failures))
    return failure.exitcode if 0 < failure.exitcode < 256 else 1


def _launch_log_levels(plan: LaunchPlan) -> dict[str, int]:
    levels = dict(_LAUNCH_LOG_LEVELS)
    if plan.quiet:
        levels["torch.distributed.elastic"] = logging.ERROR
    return levels


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
        first = received[0]
        sys.stderr.write(f"hasten launch: stopped by {signal.Signals(first).name}; all processes were ended.\n")
        return 128 + int(first)
    return 128 - code if code < 0 else code


def _terminate_with_parent() -> Any:
    """A `preexec_fn` that makes the child (mpirun) get SIGTERM when this launcher dies (Linux; None elsewhere)."""
    from ..process.lifetime import arm_parent_death_signal, parent_death_signal_available

    if not parent_death_signal_available():  # also loads libc here, before the fork
        return None
    parent = os.getpid()
    return lambda: arm_parent_death_signal(parent)


# -- this process is put back as it was ------------------------------------------------------------
@contextlib.contextmanager
def _patched_environ(values: Mapping[str, str]) -> Iterator[None]:
    """Set variables for the duration of the launch; afterwards the environment is exactly as before.

    The elastic agent also writes to os.environ (TORCHELASTIC_*); those go too.
    """
    with restored_environment():
        os.environ.update(values)
        yield


@contextlib.contextmanager
def _restored_signal_handlers() -> Iterator[None]:
    """The agent installs SIGTERM/SIGINT/... handlers and leaves them; put the caller's back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {}
    for name in AGENT_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is not None:
            saved[sig] = signal.getsignal(sig)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


@contextlib.contextmanager
def _log_levels(levels: Mapping[str, int]) -> Iterator[None]:
    saved = {name: logging.getLogger(name).level for name in levels}
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)
