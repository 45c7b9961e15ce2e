"""Starting a training function on several processes from a notebook or a Python session.

`notebook_launcher(function, args, num_processes=N)` runs ``function(*args)``
in N processes of this machine, each with the variables torchrun would set
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...) and hasten's launch spec,
so an `Accelerator()` created inside the function is distributed.
`debug_launcher` does the same on CPUs only, to debug a distributed loop
on a laptop.

How it works: the same plan -> run code as `hasten launch`
(`hasten.launch.run.launch`: the workers' environment, the board
directory, restarts, failure records, leftovers), with one difference:
each process runs the function, forked by torch's elastic agent in this
process (`hasten.launch.worker.run_function`), instead of a script; a plan
of one process calls the function right here, with the launch spec. Fork
(not spawn) is what lets a function defined in a notebook cell run in the
workers: spawned children re-import everything by name, and a cell's
functions have no importable name. Forking is only safe while this process
has not initialised CUDA, hence the refusal when it has.

Failures: each worker reports its exception in torchelastic's error file
(and prints it with its rank); when the run fails, every error file of the
run is read and the root cause is chosen the same way `hasten launch` does
(`hasten.launch.failures.root_cause`: "connection closed by peer" errors of the
healthy ranks and the ranks the agent stopped rank last). The caller gets a
`WorkerFailedError` naming that rank, with the worker's exception type,
message and traceback text. No worker outlives the call: the agent stops
the others after a failure (SIGTERM, then SIGKILL), and every worker asks
Linux to end it if this process dies. A worker killed by a signal (out of
memory) leaves no error file; the message then says so, and may only name
the rank that lost contact with it. Afterwards this process's environment
variables, signal handlers and log levels are as before the call.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, Callable, Mapping, Sequence

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from ..process.launch_spec import LaunchSpec
from .plan import LaunchError, LaunchPlan, find_free_port, port_in_use

__all__ = ["notebook_launcher", "debug_launcher", "WorkerFailedError", "test_launch"]


def test_launch() -> None:
    """Check that this process can set up its state (what a launched function does first); raises if it cannot.

    Example:
        >>> test_launch()
    """
    from ..runtime.state import PartialState

    PartialState()


test_launch.__test__ = False  # type: ignore[attr-defined]  # a launcher's probe, not a pytest test


class WorkerFailedError(ChildFailedError, RuntimeError):
    """A launched process raised: the root cause, with its rank and the worker's traceback.

    A `ChildFailedError` (what scripts written for torchrun or the peer
    catch, with its `name` and `failures`), whose message is hasten's own:
    the failing rank and its exception rather than torch's table.

    Attributes:
        rank: global rank of the process that failed first (not counting
            the ones that only lost a peer or were stopped).
        error: the worker's exception as ``"Type: message"`` (empty if it
            was killed by a signal and could not report).
        worker_traceback: the worker's traceback text (may be empty).
    """

    def __init__(self, message: str, rank: int, error: str = "", worker_traceback: str = "",
                 failures: Mapping[int, Any] | None = None) -> None:
        self.name = "notebook_launcher"
        self.failures = dict(failures or {})
        Exception.__init__(self, message)  # not ChildFailedError's: its message is torch's table
        self.rank = rank
        self.error = error
        self.worker_traceback = worker_traceback


# -- public API -------------------------------------------------------------------------------
def notebook_launcher(
    function: Callable[..., Any],
    args: Sequence[Any] = (),
    num_processes: int | None = None,
    mixed_precision: str = "no",
    use_port: str | int = "29500",
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
    rdzv_backend: str = "static",
    rdzv_endpoint: str = "",
    rdzv_conf: dict[str, Any] | None = None,
    rdzv_id: str = "none",
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    log_line_prefix_template: str | None = None,
) -> None:
    """Run ``function(*args)`` on `num_processes` processes of this machine, from a notebook or a script.

    Each process gets the variables torchrun would set (RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...) and
    hasten's launch spec, so create the `Accelerator` *inside* `function`;
    it then joins the process group of the run. Workers are forked, so
    `function` may be defined in a notebook cell. Do not use CUDA in this
    process before calling (forked workers could not use it).

    Args:
        function: the training function; it runs once in every process.
        args: positional arguments for `function` (inherited by fork, so
            anything works, even unpicklable objects).
        num_processes: processes on this machine. None: one per GPU when
            there are several, else 1. With one process, `function` runs
            right here, in this process, and its exceptions are the usual ones.
        mixed_precision: "no", "fp16", "bf16" or "fp8" (any case), for the Accelerators
            created inside `function`, in every process (an explicit
            ``Accelerator(mixed_precision=...)`` wins); another value is a ValueError.
        use_port: port of the rendezvous on `master_addr` (must be free on
            node 0 with the static rendezvous).
        master_addr: address of node 0.
        node_rank: this machine's rank, for a run across machines.
        num_nodes: the number of machines (each runs `num_processes` processes).
        rdzv_backend: torchelastic rendezvous backend ("static" needs none
            of the three settings below).
        rdzv_endpoint: torchelastic rendezvous endpoint.
        rdzv_conf: torchelastic rendezvous configuration.
        rdzv_id: torchelastic rendezvous id.
        max_restarts: times the whole group is restarted after a failure.
        monitor_interval: seconds between the agent's checks of the workers.
        log_line_prefix_template: e.g. ``"[${rank}]: "`` to prefix each
            worker's output lines (torchelastic's template).

    Returns:
        None, like the peer library's launcher: the workers' return values
        are dropped. Have rank 0 write what you need to a file (or print it).

    Raises:
        WorkerFailedError: a worker raised; the message names the rank that
            failed first and includes its exception and traceback.
        LaunchError: the launch cannot work (bad numbers, an unknown
            `mixed_precision`, busy port, CUDA already initialised here, a
            process group already exists here); a ValueError.

    Example:
        >>> def train(out_dir):
        ...     from pathlib import Path
        ...     from hasten import Accelerator
        ...     accelerator = Accelerator(cpu=True)
        ...     accelerator.print(f"{accelerator.num_processes} processes")  # shown in a notebook's output
        ...     if accelerator.is_main_process:
        ...         Path(out_dir, "processes.txt").write_text(str(accelerator.num_processes))
        >>> notebook_launcher(train, (".",), num_processes=2, use_port=29555)
        >>> open("processes.txt").read()
        '2'
    """
    if num_processes is None:
        num_processes = _default_num_processes()
    _check_counts(num_processes, num_nodes, node_rank)
    spec = _spec(mixed_precision, cpu=False)
    if num_processes == 1 and num_nodes == 1 and max_restarts == 0:  # runs right here (`launch.run`)
        _launch(LaunchPlan(target=_name(function), spec=spec, function=function, function_args=tuple(args)))
        return None
    _refuse_unsafe_fork()
    port = _port(use_port)
    if rdzv_backend == "static" and node_rank == 0 and not rdzv_endpoint and port_in_use(port, master_addr):
        raise LaunchError(
            f"port {port} on {master_addr} is already in use (another run or notebook launch?); "
            "pass another use_port."
        )
    _launch(LaunchPlan(
        target=_name(function), num_processes=num_processes * num_nodes, num_machines=num_nodes,
        machine_rank=node_rank, main_process_ip=master_addr, main_process_port=port, rdzv_backend=rdzv_backend,
        max_restarts=max_restarts, monitor_interval=monitor_interval, spec=spec,
        function=function, function_args=tuple(args), rdzv_endpoint=rdzv_endpoint or None, rdzv_id=rdzv_id,
        rdzv_conf=dict(rdzv_conf or {}), log_line_prefix_template=log_line_prefix_template,
    ))
    return None


def debug_launcher(function: Callable[..., Any], args: Sequence[Any] = (), num_processes: int = 2) -> None:
    """Run ``function(*args)`` on `num_processes` CPU processes, to debug distributed code without GPUs.

    Like `notebook_launcher` but every process computes on the CPU (gloo)
    and the rendezvous uses a free port on 127.0.0.1, so several debug runs
    never collide. Errors reach the caller the same way: a
    `WorkerFailedError` naming the failing rank, with its traceback.

    Returns:
        None (the workers' return values are dropped).

    Example:
        >>> def check():
        ...     import torch
        ...     from hasten import Accelerator
        ...     accelerator = Accelerator()
        ...     total = accelerator.reduce(torch.ones(1), reduction="sum")
        ...     assert total.item() == accelerator.num_processes
        >>> debug_launcher(check, num_processes=2)
    """
    _check_counts(num_processes, 1, 0)
    spec = _spec("no", cpu=True)
    if num_processes == 1:  # runs right here (`launch.run`)
        _launch(LaunchPlan(target=_name(function), spec=spec, function=function, function_args=tuple(args)))
        return None
    _launch(LaunchPlan(
        target=_name(function), num_processes=num_processes, main_process_ip="127.0.0.1",
        main_process_port=find_free_port(), spec=spec, function=function, function_args=tuple(args),
    ))
    return None


# -- checks -------------------------------------------------------------------------------------
def _default_num_processes() -> int:
    """One process per GPU when there are several (counted without initialising CUDA), else 1."""
    from .gpus import gpu_compute_capabilities

    return max(1, len(gpu_compute_capabilities()))


def _check_counts(num_processes: Any, num_nodes: Any, node_rank: Any) -> None:
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise LaunchError(f"num_processes must be a whole number of at least 1, got {num_processes!r}.")
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise LaunchError(f"num_nodes must be a whole number of at least 1, got {num_nodes!r}.")
    if not isinstance(node_rank, int) or not 0 <= node_rank < num_nodes:
        raise LaunchError(f"node_rank must be between 0 and num_nodes - 1 = {num_nodes - 1}, got {node_rank!r}.")


def _spec(mixed_precision: str, cpu: bool) -> LaunchSpec:
    from ..options.enums import PrecisionType

    if str(mixed_precision).lower() not in PrecisionType.list():
        raise LaunchError(f"Unknown mixed_precision mode: {mixed_precision!r}; choose one of {PrecisionType.list()}.")
    try:
        return LaunchSpec(mixed_precision=str(mixed_precision).lower(), cpu=cpu)
    except ValueError as error:
        raise LaunchError(str(error)) from None


def _port(use_port: str | int) -> int:
    try:
        port = int(use_port)
    except (TypeError, ValueError):
        port = -1
    if not 0 < port < 65536:
        raise LaunchError(f"use_port must be a port number between 1 and 65535, got {use_port!r}.")
    return port


def _refuse_unsafe_fork() -> None:
    """Refuse states of this process that forked workers cannot inherit."""
    if "torch" not in sys.modules:
        return
    import torch
    import torch.distributed as dist

    if torch.cuda.is_initialized():
        raise LaunchError(
            "CUDA was already initialised in this process, so forked workers cannot use it; restart the "
            "kernel and create the Accelerator (and anything touching CUDA) only inside the launched function."
        )
    if dist.is_available() and dist.is_initialized():
        raise LaunchError(
            "this process already belongs to a process group, which forked workers cannot share; restart "
            "the kernel and create the Accelerator only inside the launched function."
        )


# -- running ------------------------------------------------------------------------------------
def _name(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", type(function).__name__)


def _launch(plan: LaunchPlan) -> None:
    """Run the plan through the launch path of `hasten launch`, wait, and raise the root cause of a failure."""
    from .run import launch

    outcome = launch(plan)
    if outcome.preempted is not None:  # what the main process prints when no launcher shows it
        sys.stderr.write(f"hasten: {outcome.preempted}.\n")
    if outcome.signum == signal.SIGINT:
        raise KeyboardInterrupt("interrupted; all launched processes were ended.")
    if outcome.signum is not None:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        raise SignalException(f"Process {os.getpid()} got signal: {outcome.signum}", sigval=signal.Signals(outcome.signum))
    if outcome.unresponsive is not None:  # a frozen process: the launcher's verdict names it
        raise WorkerFailedError(outcome.unresponsive, rank=outcome.frozen[0] if outcome.frozen else -1,
                                failures=outcome.reported)
    if outcome.failures:
        raise _worker_failed(outcome.failures, outcome.reported, plan.num_processes)


# -- failures ------------------------------------------------------------------------------------
def _worker_failed(failures: Mapping[int, Any], reported: Mapping[int, Any], world_size: int) -> WorkerFailedError:
    """The exception for the caller: the root cause among every failure of the failed attempt."""
    from .failures import error_and_traceback, is_peer_lost, root_cause, signal_name

    rank, failure = root_cause(dict(failures))
    error, stack = error_and_traceback(failure)
    if error and is_peer_lost(error):
        # Every report is collateral: the culprit left no error file (killed by a signal, os._exit, ...).
        what = (
            "lost contact with another process of the run, which ended without a Python exception "
            f"(killed by a signal, out of memory?): {error.splitlines()[0]}"
        )
    elif error:
        what = f"failed with {error}"
    else:
        exitcode = getattr(failure, "exitcode", 1)
        what = f"was killed by {signal_name(-exitcode)}" if exitcode < 0 else f"exited with code {exitcode}"
    message = f"rank {rank} of {world_size} {what}"
    if stack:
        message += f"\n\nTraceback of rank {rank}:\n{stack.rstrip()}"
    return WorkerFailedError(message, rank=rank, error=error, worker_traceback=stack, failures=reported)
