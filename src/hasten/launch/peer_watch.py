"""Busy is not dead: an elastic run finds a lost machine from the launchers' signs of life, not from a timeout.

The process group of an elastic run keeps the user's timeout
(`InitProcessGroupKwargs`; Accelerate's 30 minutes otherwise), as any other
run: a main process that evaluates, saves or pushes to a hub for long while
the others wait in `wait_for_everyone` is waited for. What finds a machine
that is gone or cut off, within the liveness limit (`--liveness_timeout`),
are signs of life:

- a machine that is killed closes its connections: the others' collectives
  fail at once;
- a process that freezes (every thread stopped) is ended and named by its
  own machine's launcher (`hasten.launch.liveness`);
- a machine that cannot reach the rendezvous store stops itself
  (`hasten.launch.elastic.StoreWatch`);
- and here, for the machines that still reach the store: each launcher
  renews, every second from a thread of its own, a heartbeat in the
  rendezvous store under the round its processes are in (`Seat`, read from
  their heartbeat files). A launcher watches the heartbeats of the other
  machines of its round; one that did not change for the liveness limit is
  a machine that is down or cut off (its launcher was killed, its network
  is gone, the machine froze). The launcher then ends its own processes,
  which wait for that machine or soon will, with one line naming it, and
  torch's agent re-forms the group without it, as after any failure.

A launcher is never busy (its processes compute; it sleeps), so its
heartbeat stops only when the machine or its network does. A machine whose
processes finished says so (``left``) and is not waited for. Membership
stays torch's: this only decides that a member is silent, and ends local
processes.

Example:
    >>> silence = Silence(limit=10.0)  # machine 0 of a round of two watches machine 1, once a second
    >>> seat = Seat("10.0.0.1:41234", machine=0, machines=2)
    >>> [silence.look(seat, {1: {"beat": min(second, 3)}}, now=float(second)) for second in range(15)]
    [[], [], [], [], [], [], [], [], [], [], [], [], [], [1], [1]]
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Mapping

from ..process.heartbeat import read_heartbeat

__all__ = ["Seat", "seat_of", "Silence", "PeerWatch", "silent_line", "peer_key"]

_KEY = "hasten/peers/{}/{}"


@dataclass(frozen=True)
class Seat:
    """A machine's place in one round of an elastic run: the round's name, its place in it, the round's machines.

    Example:
        >>> Seat("10.0.0.1:41234", machine=1, machines=2).machine
        1
    """

    round: str  # the address of the round's process-group store (new in every round)
    machine: int  # torch's group rank of this machine in the round
    machines: int  # the machines of the round


def peer_key(seat: Seat, machine: int) -> str:
    """The rendezvous-store key under which `machine` of `seat`'s round renews its heartbeat.

    Example:
        >>> peer_key(Seat("10.0.0.1:41234", 0, 2), 1)
        'hasten/peers/10.0.0.1:41234/1'
    """
    return _KEY.format(seat.round, machine)


def seat_of(directory: str) -> Seat | None:
    """The round this machine's processes are in, from the newest of their heartbeat files (None before any).

    The newest file is this round's (each process renews its own every
    second; files of ended processes are older), and a frozen process's
    file stays the newest until a new round's processes start.

    Example:
        >>> import tempfile
        >>> seat_of(tempfile.mkdtemp()) is None
        True
    """
    newest: tuple[int, dict[str, Any]] | None = None
    for path in glob.glob(os.path.join(directory, "rank-*.json")):
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            continue
        if newest is None or mtime > newest[0]:
            record = read_heartbeat(path)
            if record is not None and "round" in record:
                newest = (mtime, record)
    if newest is None:
        return None
    record = newest[1]
    try:
        return Seat(str(record["round"]), int(record["machine"]), int(record["machines"]))
    except (KeyError, TypeError, ValueError):
        return None


class Silence:
    """Which machines of a round stopped renewing their heartbeats: the judgement, one look at a time.

    `look` is given what every other machine of the round last wrote (None
    where nothing was written yet) at `now` (seconds, the caller's clock),
    and returns the machines whose heartbeat has not changed for `limit`
    seconds since this watch began to watch the round; a machine never
    heard from in the round gets twice as long (its processes may start
    a little later than this machine's). A machine that wrote ``left`` is
    never silent.
    Looks far apart (this launcher was suspended, or could not read the
    store meanwhile) start every count again: nobody was watched.

    Example:
        >>> silence = Silence(limit=4.0)
        >>> seat = Seat("r1", machine=1, machines=3)
        >>> silence.look(seat, {0: {"beat": 1}, 2: None}, now=0.0)
        []
        >>> silence.look(seat, {0: {"beat": 5}, 2: {"left": True}}, now=2.0)
        []
        >>> silence.look(seat, {0: {"beat": 5}, 2: {"left": True}}, now=4.0)
        []
        >>> silence.look(seat, {0: {"beat": 5}, 2: {"left": True}}, now=6.0)
        [0]
        >>> silence.look(Seat("r2", 1, 2), {0: None}, now=7.0), silence.look(Seat("r2", 1, 2), {0: None}, now=9.0)
        ([], [])
    """

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.seat: Seat | None = None
        self.heard: dict[int, tuple[Any, float]] = {}  # machine -> (its last beat, when it changed)
        self._last_look: float | None = None

    def look(self, seat: Seat, beats: Mapping[int, Mapping[str, Any] | None], now: float) -> list[int]:
        if seat != self.seat:  # a new round: a new count for each of its machines
            self.seat, self.heard = seat, {}
        if self._last_look is not None and now - self._last_look > self.limit / 2:
            self.heard = {machine: (beat, now) for machine, (beat, _) in self.heard.items()}
        self._last_look = now
        silent = []
        for machine in range(seat.machines):
            if machine == seat.machine:
                continue
            beat = beats.get(machine)
            if beat is not None and beat.get("left"):
                self.heard.pop(machine, None)
                continue
            mark = None if beat is None else beat.get("beat")
            heard = self.heard.get(machine)
            if heard is None or heard[0] != mark:
                self.heard[machine] = (mark, now)
            elif now - heard[1] >= (self.limit if mark is not None else 2 * self.limit):
                silent.append(machine)
        return silent


def silent_line(seat: Seat, machine: int, beat: Mapping[str, Any] | None, limit: float, store: str) -> str:
    """The one sentence a launcher says when `machine` of its round went silent.

    Example:
        >>> print(silent_line(Seat("r", 0, 2), 1, {"name": "node-b/1", "address": "10.0.0.2", "beat": 9}, 10.0,
        ...                   "10.0.0.1:29500"))  # doctest: +ELLIPSIS
        machine node-b/1 (10.0.0.2) of the elastic run showed no sign of life for 10 s (--liveness_timeout): ...
    """
    if beat is None or not beat.get("name"):
        who = f"machine {machine} of the {seat.machines} of this round of the elastic run"
        how = "its launcher never renewed its heartbeat in the rendezvous store"
    else:
        address = f" ({beat['address']})" if beat.get("address") else ""
        who = f"machine {beat['name']}{address} of the elastic run"
        how = "its launcher stopped renewing its heartbeat in the rendezvous store"
    return (f"{who} showed no sign of life for {limit:g} s (--liveness_timeout): {how} at {store}, so it is down or "
            "cut off from the network; this machine ends its processes, which wait for it or soon would, and the "
            "group re-forms without it (start that machine's command again once it is back, and it rejoins)")


class PeerWatch:
    """A thread of an elastic run's launcher: renew this machine's heartbeat in the rendezvous store, and watch the
    other machines' of its round (see the module doc).

    `directory` holds this machine's processes' heartbeat files (where the
    round is read from); `identity` is what the heartbeat says of this
    machine (``name``, ``address``), for the others' line. Once per round,
    when a machine of the round went silent for `limit` seconds,
    `on_silent(round, line)` ends this machine's processes of that round
    and says whether any was still running; if so, `verdict` keeps the
    line (a round whose processes ended already, say when the lost
    machine's closed connections failed them, is being re-formed: nothing
    to end, nothing to say). Where the store cannot be reached, nothing is
    judged (that is `StoreWatch`'s case).

    Example:
        >>> import tempfile
        >>> watch = PeerWatch("127.0.0.1", 9, limit=10.0, directory=tempfile.mkdtemp(), identity={"name": "a/0"},
        ...                   on_silent=lambda round_, line: True)
        >>> watch.look(); watch.verdict is None  # no process of a round yet: nothing to renew, nothing to watch
        True
    """

    def __init__(self, host: str, port: int, limit: float, directory: str, identity: Mapping[str, Any],
                 on_silent: Callable[[str, str], bool], every: float = 1.0) -> None:
        self.host, self.port, self.limit, self.every = host, port, limit, every
        self.directory, self.identity, self.on_silent = directory, dict(identity), on_silent
        self.silence = Silence(limit)
        self.verdict: str | None = None  # the line for the round this machine is in, if one of its machines went silent
        self.seat: Seat | None = None
        self._acted: Seat | None = None
        self._beat = 0
        self._store: Any = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hasten-peer-watch", daemon=True)

    @property
    def io_timeout(self) -> float:
        """Seconds one store operation may take (an unreachable store fails it; the watch tries again)."""
        return min(5.0, max(0.5, self.limit / 4))

    def start(self) -> None:
        if self.limit > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():  # a thread blocked on a store that does not answer is not waited for
            self._thread.join(0.5)

    def leave(self) -> None:
        """This machine's processes are done: say so (the others do not wait for its heartbeat), and stop.

        The store is given `io_timeout` seconds (a store that does not answer
        is left behind: the launcher does not wait for it).
        """
        self.stop()
        seat = self.seat
        if seat is None:
            return

        def say() -> None:
            with contextlib.suppress(Exception):  # the store may be gone with the main machine: nobody waits then
                self._client().set(peer_key(seat, seat.machine), json.dumps({**self.identity, "left": True}))

        saying = threading.Thread(target=say, name="hasten-peer-leave", daemon=True)
        saying.start()
        saying.join(self.io_timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            with contextlib.suppress(Exception):  # a look that fails is retried; the run is never harmed
                self.look()

    def _client(self) -> Any:
        if self._store is None:
            # first a plain connection: torch's client logs every failed connect with its C++ stack, each second
            socket.create_connection((self.host, self.port), timeout=self.io_timeout).close()
            from torch.distributed import TCPStore

            self._store = TCPStore(self.host, self.port, is_master=False, wait_for_workers=False,
                                   timeout=timedelta(seconds=self.io_timeout))
        return self._store

    def look(self) -> None:
        """Renew this machine's heartbeat, read the others', and act on a machine that went silent (once a round)."""
        seat = seat_of(self.directory) or self.seat
        if seat is None:
            return
        if seat != self.seat:
            self.seat, self.verdict = seat, None
        try:  # (an operation the store does not answer may block this thread for long: nobody waits for it)
            store = self._client()
            self._beat += 1
            store.set(peer_key(seat, seat.machine), json.dumps({**self.identity, "beat": self._beat}))
            beats = {machine: _read(store, peer_key(seat, machine))
                     for machine in range(seat.machines) if machine != seat.machine}
        except Exception:  # noqa: BLE001 - out of reach: StoreWatch decides about this machine; connect again next time
            self._store = None
            return
        silent = self.silence.look(seat, beats, time.monotonic())
        if silent and self._acted != seat:
            self._acted = seat
            line = silent_line(seat, silent[0], beats.get(silent[0]), self.limit, f"{self.host}:{self.port}")
            if self.on_silent(seat.round, line):
                self.verdict = line


def _read(store: Any, key: str) -> dict[str, Any] | None:
    if not store.check([key]):
        return None
    value = json.loads(store.get(key))
    return value if isinstance(value, dict) else None
