"""Who trains each optimizer step of a live run: torchft's per-step quorum, and healing a joiner from a live peer.

The only module that imports torchft (lazily, on the first step; without it, one sentence says how to install it).
`LiveGroup` wraps one `torchft.Manager` per machine (one process per machine in phase 1: the machine's replica group is
this process, with a store of its own), synchronous quorums (``use_async_quorum=False``: the step's size and, for a
joiner, the peer's state are known when `begin_step` returns), a reconfigurable gloo group and state sent over it
(`transport.JsonTransport`: tensors as bytes, the rest as JSON, where torchft's own transport pickles; a joiner
unpickles nothing a peer sends). Collective failures are recorded and reported as False, never raised.

Across hosts, each machine is known to the others by the address its launcher found the main machine reaches it at
(`LiveSettings.address`; loopback on one host). Its replica-group store (the one torchft's quorum hands to
the other machines for the cross-machine gloo group) and its manager (which a healing machine asks for the
checkpoint's metadata) are advertised there, and the manager listens on that address only, not on every interface.

Example:
    >>> group = LiveGroup("localhost:29510", replica=1)     # nothing is started before the first step
    >>> group.replica_id, group.started
    ('00001', False)
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any, Callable

from .layout import LiveQuorum

__all__ = ["LiveGroup", "LiveUnavailable", "torchft_hint"]


class LiveUnavailable(RuntimeError):
    """torchft, which a live run needs, is not importable (one sentence with the fix)."""


def torchft_hint() -> str:
    """The sentence said when torchft is missing.

    Example:
        >>> "pip install torchft" in torchft_hint()
        True
    """
    return ("live elastic recovery needs torchft (membership and healing): pip install torchft, or launch without "
            "live recovery (checkpoint restarts).")


def _torchft() -> Any:
    try:
        import torchft
    except ImportError as err:
        raise LiveUnavailable(torchft_hint()) from err
    return torchft


def _listen_on(address: str) -> None:
    """Make torchft's manager listen on `address` only (torchft 0.2 binds ``[::]``: every interface)."""
    import torchft.manager as manager_module

    original = getattr(manager_module, "_hasten_server", None) or getattr(manager_module, "ManagerServer", None)
    if original is None:  # (another torchft: its own binding stays)
        return
    manager_module._hasten_server = original
    host = f"[{address}]" if ":" in address else address

    def server(*args: Any, bind: str, **kwargs: Any) -> Any:
        return original(*args, bind=f"{host}:{bind.rsplit(':', 1)[-1]}", **kwargs)

    manager_module.ManagerServer = server


class LiveGroup:
    """This machine in a live run: `begin_step()` -> the step's `LiveQuorum`, `allreduce(flat)` -> bool, `commit()`
    -> bool (every member of my group succeeded: step the optimizer), `register_state(save, load)` (what a joiner
    receives), `close()`.

    `replica` is the machine's rank (zero-padded, so machine 0 sorts first in torchft's quorum order);
    `min_replicas` the machines a step needs; `timeout` bounds the collectives (busy is not dead: keep it long, a lost
    peer shows as a closed connection at once).

    Example:
        >>> group = LiveGroup("localhost:29510", replica=0, min_replicas=1)
        >>> group.register_state(lambda: {"w": 1}, lambda state: None); sorted(group._states)
        ['hasten']
    """

    def __init__(self, lighthouse: str, replica: int = 0, min_replicas: int = 1,
                 timeout: timedelta = timedelta(seconds=30), quorum_timeout: timedelta = timedelta(seconds=120),
                 rank: int = 0, world_size: int = 1, store_port: int | None = None, address: str = "127.0.0.1") -> None:
        self.lighthouse = lighthouse
        self.address = address  # where the other machines reach this one's store and manager
        self.replica_id = f"{int(replica):05d}"
        # this process in its machine's group (the replica group): torchft's group rank and size; several processes
        # meet at the store their local rank 0 hosts (`store_port`), one process hosts its own
        self.rank, self.world_size, self.store_port = int(rank), int(world_size), store_port
        self.min_replicas = int(min_replicas)
        self.timeout = timeout
        self.quorum_timeout = quorum_timeout
        self._states: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {}
        self._manager: Any = None
        self._store: Any = None
        self._healed = False
        self.error: BaseException | None = None  # the last failure recorded (allreduce or commit)
        # the optimizer steps done when this machine starts (a run resumed from a checkpoint): a machine behind the
        # group's furthest heals from it, so machines that lost everything catch up with the one that read a file
        self.resume_step = 0

    @property
    def started(self) -> bool:
        """Has this machine joined the live group (its manager heartbeats the lighthouse)?"""
        return self._manager is not None

    def register_state(self, save: Callable[[], Any], load: Callable[[Any], None], key: str = "hasten") -> None:
        """`save()` gives what a joiner needs (tensors in nested dicts), `load(state)` applies a received one."""
        self._states[key] = (save, load)

    def _start(self) -> Any:
        torchft = _torchft()
        from .transport import JsonTransport

        os.environ.setdefault("RUST_LOG", "warn")  # torchft's Rust INFO lines would fill the terminal
        _quiet_flight_recorder()
        if self.store_port is None:  # one process per machine: the replica group is this process, its store its own
            self.host_store()
        address = self.address
        _listen_on(address)
        pg = torchft.ProcessGroupGloo(timeout=self.timeout)
        manager = torchft.Manager(
            pg=pg, load_state_dict=None, state_dict=None, min_replica_size=self.min_replicas,
            use_async_quorum=False, timeout=self.timeout, quorum_timeout=self.quorum_timeout,
            rank=self.rank, world_size=self.world_size, store_addr=address, store_port=self.store_port,
            hostname=address, lighthouse_addr=self.lighthouse, replica_id=self.replica_id,
            checkpoint_transport=JsonTransport(pg, timeout=self.timeout, mesh=self._mesh))
        for key, (save, load) in self._states.items():
            manager.register_state_dict_fn(key, self._loader(load), save)
        if self.resume_step:
            manager.load_state_dict({"step": int(self.resume_step), "batches_committed": 0})
        self._manager = manager
        return manager

    def _mesh(self) -> Any:
        """The device mesh of this machine's sharded state (FSDP2 within the machine), where a healed shard goes."""
        pending = [save() for save, _ in self._states.values()]
        while pending:
            value = pending.pop()
            if hasattr(value, "device_mesh") and hasattr(value, "placements"):
                return value.device_mesh
            if isinstance(value, dict):
                pending.extend(value.values())
            elif isinstance(value, (list, tuple)):
                pending.extend(value)
        return None

    def _loader(self, load: Callable[[Any], None]) -> Callable[[Any], None]:
        def apply(state: Any) -> None:
            load(state)
            self._healed = True
        return apply

    def begin_step(self) -> LiveQuorum:
        """The quorum of the step about to start (blocks until the lighthouse forms it; a joiner is healed inside)."""
        manager = self._manager if self._manager is not None else self._start()
        self._healed = False
        manager.start_quorum()
        return LiveQuorum(step=int(manager.current_step()), replicas=int(manager.num_participants()),
                          replica_rank=int(manager.participating_rank() or 0), quorum_id=int(manager._quorum_id),
                          healed=self._healed)

    def allreduce(self, flat: Any) -> bool:
        """Average `flat` in place over the step's quorum; False (recorded, not raised) when it failed."""
        manager = self._manager
        try:
            manager.allreduce(flat).wait()
        except Exception as err:  # torchft records errors itself; anything else is recorded here
            self.error = err
            manager.report_error(err)
            return False
        failure = manager.errored()
        if failure is not None:
            self.error = getattr(failure, "original_exception", None) or RuntimeError(str(failure))
        return failure is None

    def commit(self) -> bool:
        """Did every member of this machine's group finish the step (step the optimizer)? False: deal it again."""
        try:
            return bool(self._manager.should_commit())
        except Exception as err:  # an RPC lost with a peer: the step does not commit
            self.error = err
            return False

    def host_store(self) -> int:
        """Host the replica group's store here (its local rank 0, before the others learn the port); returns the port.

        Example:
            >>> group = LiveGroup("localhost:29510", world_size=2); group.host_store() == group.store_port > 0
            True
        """
        import torch.distributed as dist

        self._store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self.store_port = int(self._store.port)
        return self.store_port

    def close(self) -> None:
        """Leave the group (the lighthouse forgets this machine when its heartbeat stops)."""
        if self._manager is not None:
            self._manager.shutdown(wait=False)
            self._manager = None


class _NoFlightRecorderWarning(logging.Filter):
    """Drops torchft's "Unable to reset NCCL flight recorder" warning: a torch without NCCL's flight recorder (every
    CPU build) has no trace to reset, and torchft says so at every change of the group. Its line for a collective
    lost with a peer ("got exception waiting for work ... Connection closed by peer") is kept, without the traceback
    through torchft's internals that came with it (the run goes on; hasten's line says what changed)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "got exception waiting for work" in message:
            record.exc_info, record.exc_text = None, None
        return "Unable to reset NCCL flight recorder" not in message


def _quiet_flight_recorder() -> None:
    """Install the filter on torchft's manager logger once (its flight-recorder warning is not the user's doing)."""
    logger = logging.getLogger("torchft.manager")
    if not any(isinstance(f, _NoFlightRecorderWarning) for f in logger.filters):
        logger.addFilter(_NoFlightRecorderWarning())
