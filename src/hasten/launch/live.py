"""The launcher's side of live recovery (`hasten launch --num_machines MIN:MAX --elastic_recovery live`).

With live recovery a lost machine costs the others no restart: they keep training in memory, and a machine that
starts its command again heals from a live peer (`hasten.process.live` is the worker's side, docs/design/
live-recovery.md the design). Membership is torchft's lighthouse, not torch's c10d rendezvous:

- the machine with ``--machine_rank 0`` runs the lighthouse in its launcher process, bound where the rendezvous store
  would be (``--main_process_ip``:``--main_process_port``), so it outlives any worker of that machine;
- every machine runs its processes as a *local*, non-elastic launch (`local_plan`: its own store on loopback,
  ``--max_restarts`` restarts of a process that dies here, which then heals from a peer); the launch spec carries
  the elastic sizes and ``live`` (lighthouse address, this machine's rank, MIN machines), so the worker takes the
  live path.

It refuses, in one sentence each (`live_problem`), what it cannot do: a fixed machine count, mpirun (as the restart
path does), a missing torchft. FSDP2 runs sharded within each machine's group and replicated across machines (HSDP).
DeepSpeed ZeRO partitions the optimizer state over every machine, so a lost machine's partitions are held nowhere
else: such a run recovers from the newest checkpoint (the restart path), and says so in one line (`checkpoint_fallback`).

Example:
    >>> from hasten.launch.plan import LaunchPlan
    >>> plan = LaunchPlan(target="t.py", num_processes=2, num_machines=2, min_machines=1, machine_rank=1,
    ...                   main_process_ip="10.0.0.1", main_process_port=29500, live=True)
    >>> lighthouse_address(plan)
    'http://10.0.0.1:29500'
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import sys
from importlib.util import find_spec
from typing import Any, Callable, Iterator

from ..process.launch_spec import MACHINE_ENV
from .elastic import elastic_spec
from .network import interface_for_address, is_loopback, local_address_for

# (`plan` below is a `launch.plan.LaunchPlan`, which imports this module: typed loosely to keep imports one-way)

__all__ = ["RECOVERY_CHOICES", "FLAG", "checkpoint_fallback", "live_problem", "lighthouse_address", "local_plan",
           "lighthouse", "run_live"]

RECOVERY_CHOICES = ("restart", "live")
FLAG = "--elastic_recovery live"
HEARTBEAT_TIMEOUT_MS = 1000  # a killed machine is out of the quorum this long after its last heartbeat (beats: 100 ms)
QUORUM_TICK_MS = 100
JOIN_TIMEOUT_MS = 2000  # how long a quorum waits for a machine that heartbeats but has not asked to join yet


def live_problem(plan: Any) -> str | None:
    """The one sentence that refuses a live plan this version cannot run, or None.

    Example:
        >>> from hasten.launch.plan import LaunchPlan
        >>> live_problem(LaunchPlan(target="t.py", num_processes=4, num_machines=2, main_process_ip="h", live=True))
        '--elastic_recovery live recovers an elastic run: give --num_machines MIN:MAX (such as 1:2), or drop --elastic_recovery live.'
    """
    if not plan.elastic:
        return f"{FLAG} recovers an elastic run: give --num_machines MIN:MAX (such as 1:2), or drop {FLAG}."
    if plan.mpirun:
        return f"{FLAG} starts each machine's process with torch's agent, not mpirun; drop --mpirun."
    if find_spec("torchft") is None and checkpoint_fallback(plan) is None:
        return (f"{FLAG} needs torchft (membership and healing): pip install torchft, or use "
                "--elastic_recovery restart (checkpoint restarts).")
    return None


def checkpoint_fallback(plan: Any) -> str | None:
    """The one line a live plan prints when its engine keeps state no other machine holds, so that it recovers from the
    newest checkpoint instead (issue: "keep a copy elsewhere in memory ... or fall back to the newest checkpoint"); None
    when it recovers live.

    Example:
        >>> from hasten.launch.plan import LaunchPlan
        >>> plan = LaunchPlan(target="t.py", num_processes=2, num_machines=2, min_machines=1, main_process_ip="h",
        ...                   live=True)
        >>> checkpoint_fallback(plan) is None
        True
    """
    if plan.spec.deepspeed is None:
        return None
    return (f"hasten launch: {FLAG}: DeepSpeed ZeRO partitions its state over every machine, so a lost machine's "
            "partitions are held nowhere else; this run recovers by starting again from the newest checkpoint "
            "(--elastic_recovery restart).")


def lighthouse_address(plan: Any) -> str:
    """Where every machine's process finds the lighthouse: the address and port the run names."""
    host = plan.master_addr
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{host}:{plan.main_process_port}"


def local_plan(plan: Any) -> Any:
    """This machine's part of a live plan: its processes, a local non-elastic launch that takes the live path.

    One process is a watched child of the launcher (heartbeats, the guardian, a stop forwarded), not torch's agent: the
    agent's launcher imports torch before it starts the worker, a second a joining machine would wait. Several are
    started by torch's agent as one local group (its store on a free local port).

    Example:
        >>> from hasten.launch.plan import LaunchPlan
        >>> plan = LaunchPlan(target="t.py", num_processes=2, num_machines=2, min_machines=1, machine_rank=1,
        ...                   main_process_ip="127.0.0.1", main_process_port=29500, live=True)
        >>> local = local_plan(plan)
        >>> local.mode, local.in_this_process, local.spec.live["replica"], local.spec.elastic["max_processes"]
        ('single', False, 1, 2)
    """
    # where the other machines reach this one (its replica group's store, its torchft manager): the address the main
    # one reaches it at, as torch's agent advertises (the hostname may resolve to loopback or an unreachable address)
    address = "127.0.0.1" if is_loopback(plan.master_addr) else \
        local_address_for(plan.master_addr) or socket.gethostname()
    live = {"lighthouse": lighthouse_address(plan), "replica": int(plan.machine_rank),
            "min_replicas": int(plan.min_machines or plan.num_machines), "address": address}
    spec = dataclasses.replace(plan.spec, elastic=plan.spec.elastic or elastic_spec(plan), live=live)
    env = dict(plan.extra_env)
    env[MACHINE_ENV] = f"{socket.gethostname()}/{plan.machine_rank}"  # who left or joined, in the live lines
    if "RUST_LOG" not in os.environ:
        env.setdefault("RUST_LOG", "warn")  # torchft's Rust INFO lines, one per quorum, otherwise
    if plan.network_interface is None and not is_loopback(plan.master_addr):
        # the live group's gloo connections go to the other machines: advertise the interface that reaches them
        # (the environment's choice wins over a detected one; an explicit --network_interface is kept by the plan)
        interface = interface_for_address(plan.master_addr)
        if interface:
            for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
                if name not in os.environ:
                    env.setdefault(name, interface)
    return dataclasses.replace(
        plan, live=False, num_processes=plan.processes_per_machine, num_machines=1, min_machines=None, machine_rank=0,
        main_process_ip="127.0.0.1", main_process_port=None, rdzv_backend="static", rdzv_conf=None, rdzv_id=None,
        rdzv_endpoint=None, through_torchrun=False, in_this_process=False, spec=spec, extra_env=env,
    ).validate(check_script=False)


@contextlib.contextmanager
def lighthouse(plan: Any) -> Iterator[Any]:
    """The lighthouse of a live run, in this launcher for as long as the block runs (machine 0 only; else None)."""
    if plan.machine_rank != 0:
        yield None
        return
    added = "RUST_LOG" not in os.environ
    os.environ.setdefault("RUST_LOG", "warn")  # torchft's Rust side: its INFO lines, one per quorum, otherwise
    try:
        from torchft.coordination import LighthouseServer

        host = plan.master_addr
        host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        server = LighthouseServer(bind=f"{host}:{plan.main_process_port}",
                                  min_replicas=int(plan.min_machines or plan.num_machines),
                                  join_timeout_ms=JOIN_TIMEOUT_MS, quorum_tick_ms=QUORUM_TICK_MS,
                                  heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS)
        try:
            yield server
        finally:
            server.shutdown()
    finally:
        if added:  # this process's environment is put back, as after any launch
            os.environ.pop("RUST_LOG", None)


def run_live(plan: Any, launch: Callable[[Any], Any]) -> Any:
    """Carry out a live plan with `launch` (`launch.run.launch`): the lighthouse here on machine 0, then this
    machine's local launch (or, for an engine whose state no other machine holds, the restart path, said once)."""
    if (line := checkpoint_fallback(plan)) is not None:
        print(line, file=sys.stderr, flush=True)
        return launch(dataclasses.replace(plan, live=False))
    with lighthouse(plan), _lighthouse_watch(plan):  # (first: the local launch's free port is then never the lighthouse's)
        return launch(local_plan(plan))


def lighthouse_lost(plan: Any) -> str:
    """The one sentence a machine says when the run's lighthouse (on machine 0) cannot be reached any more.

    Example:
        >>> from hasten.launch.plan import LaunchPlan
        >>> plan = LaunchPlan(target="t.py", num_processes=2, num_machines=2, min_machines=1, machine_rank=1,
        ...                   main_process_ip="10.0.0.1", main_process_port=29500, live=True)
        >>> print(lighthouse_lost(plan))  # doctest: +ELLIPSIS
        this machine could not reach the live run's lighthouse at 10.0.0.1:29500 for 45 s (--liveness_timeout): ...
    """
    return (f"this machine could not reach the live run's lighthouse at {plan.master_addr}:{plan.main_process_port} "
            f"for {plan.liveness_timeout:g} s (--liveness_timeout): machine 0, which holds it, ended or was lost, or "
            "this machine is cut off from it, and no group forms without it, so this machine stops; start the run "
            "again (it resumes from the newest checkpoint, see docs/concepts/elastic.md)")


@contextlib.contextmanager
def _lighthouse_watch(plan: Any) -> Iterator[None]:
    """Every machine but the lighthouse's: while the block runs, a lighthouse unreachable for the liveness limit ends
    this machine's processes (they wait for a quorum that cannot form) and the launcher, with one line."""
    if plan.machine_rank == 0 or not plan.liveness_timeout or plan.liveness_timeout <= 0:
        yield
        return
    from .elastic import StoreWatch

    watch = StoreWatch(plan.master_addr, int(plan.main_process_port), plan.liveness_timeout,
                       on_lost=lambda _: _stop_machine(lighthouse_lost(plan)))
    watch.start()
    try:
        yield
    finally:
        watch.stop()


def _stop_machine(line: str) -> None:
    """End every process under this launcher at once (SIGKILL), say `line`, and leave with EXIT_FAILED."""
    import signal

    from ..process.launch_spec import EXIT_FAILED

    sys.stderr.write(f"hasten launch: {line}.\n")
    sys.stderr.flush()
    for pid in _descendants(os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    os._exit(EXIT_FAILED)


def _descendants(root: int) -> list[int]:
    """Every process under `root` (Linux's /proc), children first found first."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            parents.setdefault(parent, []).append(int(entry))
    found, pending = [], [root]
    while pending:
        for child in parents.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def describe_live(plan: Any) -> str:
    """What `--dry_run` prints for a live plan: the lighthouse (machine 0), then this machine's local command."""
    if (line := checkpoint_fallback(plan)) is not None:
        return f"# {line}\n{dataclasses.replace(plan, live=False).describe()}"
    local = local_plan(plan)
    where = "runs the lighthouse at" if plan.machine_rank == 0 else "finds the lighthouse at"
    return f"# live recovery: this machine {where} {lighthouse_address(plan)}\n{local.describe()}"
