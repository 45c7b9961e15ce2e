"""The launcher's side of an elastic run (`hasten launch --num_machines MIN:MAX`).

Membership is torch's: every machine runs the same command, and torch's
elastic agent (torchrun's) meets the others at a c10d rendezvous on the
main machine (`--main_process_ip`/`--main_process_port`), with
``--nnodes MIN:MAX``. When a machine is lost, the agents left re-form the
group (a restart, bounded by `--max_restarts`); when a machine starts the
command again, the agents re-form it larger at their next look (not a
restart). Each re-formation starts the script again on every process; the
script's `load_state()` resumes from the newest complete checkpoint at the
new size (see `hasten.process.elastic` for what a size means, and
`hasten.runtime.elastic` for the worker's side).

The rendezvous store lives in the agent of the machine whose address is the
endpoint; it cannot move. If that machine is lost the others cannot go on:
`store_lost` is the one sentence they say.

Example:
    >>> from hasten.launch.plan import LaunchPlan
    >>> plan = LaunchPlan(target="train.py", num_processes=2, num_machines=2, min_machines=1,
    ...                   main_process_ip="10.0.0.1", main_process_port=29500, max_restarts=3)
    >>> elastic_torchrun_argv(plan)[:4]
    ['--nnodes=1:2', '--nproc-per-node=1', '--rdzv-backend=c10d', '--rdzv-endpoint=10.0.0.1:29500']
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Callable, Mapping

from .network import is_loopback, local_address_for, owns_address

# (`plan` below is a `launch.plan.LaunchPlan`, which imports this module: typed loosely to keep imports one-way)

__all__ = ["RDZV_DEFAULTS", "RUN_ID", "elastic_spec", "elastic_torchrun_argv", "store_lost", "is_store_lost",
           "StoreWatch", "LEAVE_GRACE"]

LEAVE_GRACE = 2.0  # seconds a cut-off machine's agent has to stop on its own before the launcher leaves by itself
RUN_ID = "hasten"  # every machine of the run gives the same id (the endpoint already names the run)
# torch's defaults, but for the wait after MIN machines met: 30 s is most of the budget of a shrink (the lost
# machine's heartbeats expire in 15 s, then the survivors wait this long for more machines before going on).
RDZV_DEFAULTS: Mapping[str, Any] = {"last_call_timeout": 10}


def elastic_spec(plan: Any) -> dict[str, int]:
    """What each process of an elastic run learns of its range (`LaunchSpec.elastic`): process counts, per machine.

    Example:
        >>> from hasten.launch.plan import LaunchPlan
        >>> elastic_spec(LaunchPlan(target="t.py", num_processes=4, num_machines=2, min_machines=1))
        {'min_processes': 2, 'max_processes': 4, 'processes_per_machine': 2}
    """
    per_machine = plan.processes_per_machine
    return {"min_processes": int(plan.min_machines or plan.num_machines) * per_machine,
            "max_processes": plan.num_processes, "processes_per_machine": per_machine}


def elastic_torchrun_argv(plan: Any) -> list[str]:
    """torchrun's arguments for an elastic plan: ``--nnodes MIN:MAX`` on the c10d rendezvous of the main machine."""
    conf = {**RDZV_DEFAULTS, **dict(plan.rdzv_conf or {})}
    if is_loopback(plan.master_addr):
        # several machines of one host (a local test): each would take itself for the host, and the first to bind
        # would hold the store; machine 0 holds it, whatever order the commands start in (the others wait for it)
        conf.setdefault("is_host", int(plan.machine_rank == 0))
    else:
        # torch decides who hosts the store by the hostname's addresses, which need not include the address the
        # run names (several interfaces, a hostname resolving elsewhere): the machine that carries it hosts it
        conf.setdefault("is_host", int(owns_address(plan.master_addr)))
    rendered = ",".join(f"{key}={value}" for key, value in conf.items())
    argv = [f"--nnodes={plan.min_machines}:{plan.num_machines}", f"--nproc-per-node={plan.processes_per_machine}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={plan.master_addr}:{plan.main_process_port}",
            f"--rdzv-id={plan.rdzv_id or RUN_ID}", f"--rdzv-conf={rendered}", f"--max-restarts={plan.max_restarts}",
            f"--monitor-interval={plan.monitor_interval}"]
    if not is_loopback(plan.master_addr):  # the address the others reach this machine at, not its hostname's
        local = local_address_for(plan.master_addr)
        if local:
            argv.append(f"--local-addr={local}")
    return argv


def is_store_lost(error: BaseException) -> bool:
    """True for the errors torch's agent raises when it cannot reach the rendezvous store any more.

    Example:
        >>> is_store_lost(ValueError("no"))
        False
    """
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, (RendezvousError, ConnectionError)) or type(seen).__name__ == "DistStoreError":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def store_lost(plan: Any, error: BaseException) -> str:
    """The one sentence a machine says when the rendezvous store (on the main machine) is gone.

    Example:
        >>> from hasten.launch.plan import LaunchPlan
        >>> plan = LaunchPlan(target="t.py", num_processes=2, num_machines=2, min_machines=1,
        ...                   main_process_ip="10.0.0.1", main_process_port=29500)
        >>> store_lost(plan, ConnectionError("refused"))  # doctest: +ELLIPSIS
        'the elastic run lost its rendezvous store at 10.0.0.1:29500 (ConnectionError: refused): ...'
    """
    reason = f"{type(error).__name__}: {error}".strip().splitlines()[0][:200]
    return (f"the elastic run lost its rendezvous store at {plan.master_addr}:{plan.main_process_port} ({reason}): "
            "the machine holding it (--main_process_ip) cannot leave an elastic run, so this machine stops; start "
            "the run again with the store on a machine that stays (see docs/concepts/elastic.md)")


class StoreWatch:
    """A thread of an elastic run's launcher: can this machine still reach the rendezvous store?

    A network partition leaves the cut-off machine's processes waiting on
    connections that never close. Every `every` seconds the watch opens (and
    closes) a TCP connection to the store; when none succeeded for `limit`
    seconds (`--liveness_timeout`), it calls `on_lost` with the one sentence
    the launcher prints, once. The machine that holds the store always
    reaches it: the watch never fires there.

    Example:
        >>> watch = StoreWatch("127.0.0.1", 9, limit=0.2, on_lost=lambda line: None, every=0.01)
        >>> watch.start(); watch.join(2.0); watch.verdict is not None
        True
    """

    def __init__(self, host: str, port: int, limit: float, on_lost: Callable[[str], None], every: float = 1.0) -> None:
        self.host, self.port, self.limit, self.every = host, port, limit, every
        self.on_lost = on_lost
        self.verdict: str | None = None
        self.last_resort: threading.Timer | None = None  # set by whoever acts on the verdict; cancelled by `stop`
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hasten-store-watch", daemon=True)

    @property
    def threshold(self) -> float:
        """Seconds without contact before the verdict: early enough that the machine is stopped within `limit`
        (the launcher leaves at most `LEAVE_GRACE` seconds after the verdict)."""
        return max(self.limit - LEAVE_GRACE - self.every, self.limit / 2)

    def start(self) -> None:
        if self.limit > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self.last_resort is not None:
            self.last_resort.cancel()

    def join(self, timeout: float | None = None) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def reachable(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=max(0.05, min(2.0, self.every))):
                return True
        except OSError:
            return False

    def _run(self) -> None:
        last_seen = time.monotonic()
        while not self._stop.wait(self.every):
            now = time.monotonic()
            if self.reachable():
                last_seen = now
            elif now - last_seen >= self.threshold:
                self.verdict = (f"this machine could not reach the elastic run's rendezvous store at {self.host}:"
                                f"{self.port} for {self.limit:g} s (--liveness_timeout): it is cut off from the run "
                                "(a network partition, or the main machine is down), so it stops and the machines "
                                "that still reach the store go on; start this machine's command again once it "
                                "reaches the store, and it rejoins")
                self.on_lost(self.verdict)
                return
