"""The process group of a launched process: created once (or adopted), left cleanly at exit.

The only process-wide resource is torch's process group. hasten creates it
when the environment describes more than one process, or adopts the one the
user created, and tears down the one it created at exit with a barrier and
a destroy, because gloo processes that exit without them abort with SIGABRT
in a good share of runs. After a failure the barrier is skipped: the
healthy ranks are not at a barrier, and waiting for them would hang until
the group's timeout.

The exit barrier is preceded by a rendezvous of its own in the store
(`watchdog.leave_together`): a process that leaves publishes it first, so
it never completes another process's ``wait_for_everyone`` by accident, and
a process still waiting in a collective for it is told within seconds.

torch is imported when a group is made or left, not with this module: a
per-rank wrapper imports it for `leave_process_group`, and a script that
never touches torch.distributed does not pay for the import.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
from datetime import timedelta
from typing import Callable
from types import TracebackType

from .topology import ProcessTopology

__all__ = ["DEFAULT_TIMEOUT", "group_timeout", "init_process_group", "topology_from_group", "start_watchdog",
           "shutdown_process_group", "leave_process_group", "before_leaving"]

DEFAULT_TIMEOUT = timedelta(minutes=30)

_owned_group = False  # did hasten create the process group (and so must destroy it)?
_failed = False  # did this process die from an uncaught exception?


def _excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    global _failed
    _failed = True
    _previous_excepthook(exc_type, exc, tb)


_previous_excepthook = sys.excepthook


_before_leaving: list[Callable[[], None]] = []


def before_leaving(hook: Callable[[], None]) -> None:
    """Run `hook` before this process leaves its group after a success (a higher layer finishing work in flight).

    Example:
        >>> before_leaving(lambda: None)  # e.g. wait for a checkpoint still being written
    """
    _before_leaving.append(hook)


def _finish_work_in_flight() -> None:
    for hook in _before_leaving:
        hook()


def shutdown_process_group(success: bool = True) -> None:
    """Leave the process group cleanly: the exit rendezvous and a barrier, then destroy.

    After a failure the barrier is skipped: the healthy ranks are not at a
    barrier, and waiting for them would hang until the group's timeout.

    Example:
        >>> shutdown_process_group()  # no-op when no group exists
    """
    from . import watchdog  # (imported when used: `from hasten import Accelerator` stays light)

    global _owned_group
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if success and not _failed:
        _finish_work_in_flight()
        site = watchdog.user_site(sys._getframe(1))  # "?" at interpreter exit (atexit, under plain torchrun)
        watchdog.mark_left("left the script" if site == "?" else f"ended its process group at {site}")
        with contextlib.suppress(Exception):
            # First a rendezvous of its own (no user's wait_for_everyone can match it, and a process that
            # waits in a collective meanwhile is reported, see watchdog), then the barrier gloo needs.
            if watchdog.leave_together(group_timeout()) is not False:
                dist.barrier()
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    _owned_group = False


def leave_process_group(success: bool, what: str = "left the script") -> None:
    """What a per-rank wrapper calls after the user's code: leave the process group, if torch.distributed was used.

    Example:
        >>> leave_process_group(success=True)  # no group: nothing to do
    """
    from . import watchdog  # (imported when used: `from hasten import Accelerator` stays light)

    if "torch.distributed" not in sys.modules:
        return  # the user's code never touched torch.distributed
    if success:  # even if the script destroyed its group itself: a process waiting for this one is told
        _finish_work_in_flight()
        watchdog.mark_left(what)
    shutdown_process_group(success=success)


def group_timeout() -> float:
    """The default process group's timeout in seconds (hasten's default when torch does not say).

    Example:
        >>> group_timeout()  # no process group here: hasten's default, 30 minutes
        1800.0
    """
    import torch
    import torch.distributed as dist

    try:
        return dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout.total_seconds()  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - a private attribute: fall back to hasten's default
        return DEFAULT_TIMEOUT.total_seconds()


def _shutdown_at_exit() -> None:
    if _owned_group:
        shutdown_process_group(success=not _failed)


def init_process_group(topology: ProcessTopology, backend: str, timeout: timedelta) -> None:
    """Create the process group `topology` describes, and arrange its clean shutdown at exit."""
    global _owned_group, _previous_excepthook
    import torch.distributed as dist

    if topology.launcher == "torchrun":
        init_method = "env://"
    else:  # MPI / SLURM started the ranks: rendezvous over TCP at the master address
        init_method = f"tcp://{topology.master_addr}:{topology.master_port}"
    dist.init_process_group(
        backend=backend,
        init_method=init_method,
        rank=topology.rank,
        world_size=topology.world_size,
        timeout=timeout,
    )
    _owned_group = True
    if sys.excepthook is not _excepthook:
        _previous_excepthook = sys.excepthook
        sys.excepthook = _excepthook
    atexit.register(_shutdown_at_exit)


_watchdog_started = False


def start_watchdog() -> None:
    """One deadlock watchdog per process (see `watchdog`), on the default group's store."""
    from . import watchdog  # (imported when used: `from hasten import Accelerator` stays light)

    global _watchdog_started
    if _watchdog_started:
        return
    _watchdog_started = True
    import torch.distributed as dist

    try:
        store = dist.distributed_c10d._get_default_store()
    except (RuntimeError, ValueError, AttributeError):  # a group without a store (e.g. created from a custom backend)
        return
    watchdog.start(store, dist.get_rank(), dist.get_world_size())


def topology_from_group() -> ProcessTopology:
    """Topology of a process group the user created before hasten was used (adopted, never destroyed by hasten)."""
    import torch.distributed as dist

    env_topology = ProcessTopology.from_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    if env_topology.world_size == world and env_topology.rank == rank:
        return env_topology
    return ProcessTopology(rank=rank, world_size=world, local_rank=rank, local_world_size=world, launcher="process_group")
