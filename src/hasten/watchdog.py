"""A certain deadlock ends the run in seconds, saying where each process waits.

Every explicit hasten collective (gather, reduce, broadcast, pad, the
object collectives, wait_for_everyone, ...) marks this process as waiting
in it: (number of this process's collectives so far, operation, caller's
frame). That costs a tuple assignment. A daemon thread looks once a second;
when this process has waited more than a few seconds it publishes where in
the rendezvous store (which every process already shares), and reads where
the others are. If *every* process waits in a hasten collective and they
are not the same one (another operation, or another call number), no
process can ever move: on two looks in a row, each process prints its
Python stacks and ends with a one-line summary that the launcher shows,
e.g. ``rank 0 waits in wait_for_everyone at train.py:37 (collective #5)
while rank 1 waits in gather at train.py:42 (collective #5)``.

A process busy elsewhere (computing, or in a collective of torch's own such
as DDP's gradient all-reduce) is never part of a verdict: a slow process is
not a deadlock, and is left to the process group's timeout.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from types import FrameType
from typing import Any

__all__ = ["waiting", "enter", "leave", "start", "CollectiveDeadlock", "CollectiveTimeout"]

_PUBLISH_AFTER = 2.0  # seconds waiting before a process tells the others where it is
_LOOK_EVERY = 1.0
_VERDICT = "hasten/watchdog/verdict"

_count = 0
_current: tuple[int, str, FrameType | None, float] | None = None  # (number, operation, caller frame, since)


class CollectiveDeadlock(RuntimeError):
    """The processes wait in different collectives: none can ever continue."""


class CollectiveTimeout(RuntimeError):
    """A collective reached the process group's timeout; the message says where every process was."""


def _is_timeout(error: BaseException) -> bool:
    text = str(error).lower()
    return "timed out" in text or "timeout" in text


_store: Any = None
_world_size = 0
_rank = 0


def _published_states() -> list[dict[str, Any] | None]:
    """What every process last published (None for a process that was not waiting in a hasten collective)."""
    if _store is None:
        return []
    try:
        return [json.loads(_store.get(f"hasten/watchdog/{r}")) if _store.check([f"hasten/watchdog/{r}"]) else None
                for r in range(_world_size)]
    except Exception:  # noqa: BLE001 - the store may be gone too
        return []


def _describe_states(where: list[dict[str, Any] | None]) -> str:
    parts = [f"rank {r} waits in {w['op']} at {w['site']} (collective #{w['n']})" if w else f"rank {r} is elsewhere "
             "(computing, or in a collective of torch's own)" for r, w in enumerate(where)]
    return "; ".join(parts)


def enter(operation: str, depth: int = 2) -> None:
    """Mark this process as waiting in `operation` (called at the start of every explicit collective)."""
    global _count, _current
    _count += 1
    _current = (_count, operation, sys._getframe(depth), time.monotonic())


def leave() -> None:
    global _current
    _current = None


class waiting:  # noqa: N801 - used like a function: `with waiting("gather"):`
    """Context manager: this process waits in `operation` for the duration of the block."""

    __slots__ = ("operation",)

    def __init__(self, operation: str) -> None:
        self.operation = operation

    def __enter__(self) -> None:
        enter(self.operation, depth=3)

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        mine = _current
        leave()
        if exc is not None and _is_timeout(exc):
            where = _published_states()
            if where:  # a plain stall reached the process group's timeout: say where every process was
                if mine is not None:  # this process's own position, not what its watchdog last published
                    where[_rank] = {"n": mine[0], "op": mine[1], "site": call_site(mine[2])}
                raise CollectiveTimeout(f"{self.operation} timed out: {_describe_states(where)} "
                                        f"(torch: {str(exc).splitlines()[0][:160]})") from exc


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def call_site(frame: FrameType | None) -> str:
    """file:line of the first frame at or above `frame` that is outside hasten (the user's call)."""
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame = frame.f_back
    return "?" if frame is None else f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def start(store: Any, rank: int, world_size: int) -> threading.Thread | None:
    """Start this process's watchdog thread (once per process; needs the process group's store)."""
    global _store, _world_size, _rank
    if store is None or world_size < 2 or os.environ.get("HASTEN_WATCHDOG", "1") == "0":
        return None
    _store, _world_size, _rank = store, world_size, rank
    thread = threading.Thread(target=_watch, args=(store, rank, world_size), name="hasten-watchdog", daemon=True)
    thread.start()
    return thread


def _watch(store: Any, rank: int, world_size: int) -> None:
    published: str | None = None
    suspicious = 0
    while True:
        time.sleep(_LOOK_EVERY)
        current = _current
        waiting = current is not None and time.monotonic() - current[3] > _PUBLISH_AFTER
        state = json.dumps({"n": current[0], "op": current[1], "site": call_site(current[2])} if waiting and current else None)
        try:
            if state != published:
                store.set(f"hasten/watchdog/{rank}", state)
                published = state
            if not waiting:
                suspicious = 0
                continue
            if store.check([_VERDICT]):  # another process found the deadlock first: report it too, at once
                _report(rank, store.get(_VERDICT).decode(), store)
            others = [json.loads(store.get(f"hasten/watchdog/{r}")) if store.check([f"hasten/watchdog/{r}"]) else None
                      for r in range(world_size)]
        except Exception:  # noqa: BLE001 - the store is gone (the run is ending): nothing to watch
            return
        everyone_waits = all(o is not None for o in others)
        disagree = len({(o["n"], o["op"]) for o in others if o is not None}) > 1
        suspicious = suspicious + 1 if everyone_waits and disagree else 0
        if suspicious >= 2:
            _report(rank, _summary(others), store)


def _summary(where: list[dict[str, Any]]) -> str:
    parts = [f"rank {r} waits in {w['op']} at {w['site']} (collective #{w['n']})" for r, w in enumerate(where)]
    return "the processes wait in different collectives, so none can continue: " + " while ".join(parts)


def _report(rank: int, summary: str, store: Any) -> None:
    import traceback

    from .launch.worker import _is_hidden, exit_now, record_failure

    try:
        store.set(_VERDICT, summary)  # the other processes report at their next look, within a second
    except Exception:  # noqa: BLE001
        pass
    stacks = []
    for thread_id, frame in sys._current_frames().items():
        if thread_id == threading.get_ident():
            continue  # this watchdog
        entries = [e for e in traceback.extract_stack(frame) if not _is_hidden(e.filename)]
        stacks.append("".join(traceback.format_list(entries)))
    sys.stderr.write(f"[hasten] rank {rank} is stuck here:\n" + "\n".join(stacks))  # one write: no interleaving
    sys.stderr.flush()
    time.sleep(2 * _LOOK_EVERY)  # every process prints its stacks before the first exit makes the launcher stop the others
    record_failure(CollectiveDeadlock(summary))
    exit_now(1)
