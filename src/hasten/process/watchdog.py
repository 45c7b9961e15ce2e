"""A certain deadlock ends the run in seconds, saying where each process waits.

Two kinds of waiting are seen:

- *hasten's own collectives* (gather, reduce, broadcast, pad, the object
  collectives, wait_for_everyone, save_state, ...) mark this process as
  waiting in them: (number of this process's collectives so far, operation,
  caller's frame). That costs a tuple assignment.
- *collectives hasten did not start* (a plain ``torch.distributed`` call such
  as ``dist.barrier()``, DDP's gradient all-reduce inside ``backward``, FSDP's
  all-gathers): a daemon thread looks at the main thread's Python stack four
  times a second. When the stack sits inside torch.distributed (or inside
  autograd's backward, on a CPU-only process) and the process has used
  almost no CPU time for a second, the process is blocked there, not
  computing.

A wait that lasts a second is published in the rendezvous store (which
every process already shares), renewed twice a second while it lasts. When
*every* process waits and they are not in the same place (another
operation, or another call number), no process can ever move: after two
seconds of the same picture, each process prints its Python stacks and
ends with a one-line summary that the launcher shows, e.g. ``rank 0 waits
in wait_for_everyone at train.py:37 (collective #5) while rank 1 waits in
torch.distributed.barrier at train.py:42``. From the moment the last
process blocks, the run ends within about 5 seconds (10 at most),
whatever the process group's timeout.

Never part of a verdict: a process that computes (a long step, a save, a
compile, a slow data loader), one blocked outside torch.distributed, and
any process at all while another one is not waiting. Two processes in the
*same* torch operation are not a verdict either (a big transfer on a slow
network looks the same). Where the evidence cannot be certain — a CUDA
process, whose waits often spin on the CPU — nothing is declared, and the
process group's timeout applies (`CollectiveTimeout` then says where every
process was).

A process that *left* — its script returned, or it ended its process
group (`mark_left`, before the exit rendezvous `leave_together`, which no
`wait_for_everyone` can ever match) — publishes that at once. A process
that waits in a collective while another one has left can never continue:
after the same two seconds the run ends with ``rank 1 (pid 4242 on
node-a) left the script while rank 0 waits in gather at train.py:40
(collective #7)``.

`save_state` reads the same publications to learn, without a collective,
whether the other processes take part in a save (`positions`), and each
process's training progress, published once a second when it changed
(`set_progress`, `progress_of`).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from types import FrameType
from typing import Any, Callable

from ..core.errors import CollectiveDeadlock, CollectiveTimeout
from .launch_spec import watchdog_enabled

__all__ = ["waiting", "enter", "leave", "here", "start", "running", "positions", "published", "call_site", "user_site",
           "set_progress", "local_progress", "progress_of", "mark_left", "leave_together", "CollectiveDeadlock",
           "CollectiveTimeout"]

_LOOK_EVERY = 0.25  # seconds between two looks at this process
_PUBLISH_AFTER = 1.0  # a wait shorter than this is never published
_HEARTBEAT = 0.5  # a published wait is renewed this often (its `seq` grows), so readers know it is current
_READ_EVERY = 1.0  # a waiting process reads the others' positions this often
_VERDICT_AFTER = 2.0  # every process waiting, the same picture of different places, this long => a deadlock
_FLAT = 0.05  # a process using under 5% of one core since its wait began is blocked, not computing
_PROGRESS_EVERY = 1.0  # how often a changed training progress is published (save_state's handshake reads it)
_KEY = "hasten/watchdog/{}"
_LEFT_KEY = "hasten/watchdog/left/{}"  # set once a process left; the exit rendezvous waits for every rank's
_LEFT_POLL = 0.05
_PROGRESS_KEY = "hasten/watchdog/progress/{}"
_VERDICT = "hasten/watchdog/verdict"

_count = 0
# (collective number or None when not counted, operation, caller frame, since)
_current: tuple[int | None, str, FrameType | None, float] | None = None


def _is_timeout(error: BaseException) -> bool:
    text = str(error).lower()
    return "timed out" in text or "timeout" in text


_store: Any = None
_world_size = 0
_rank = 0
_seq = 0  # number of this process's publications (readers tell a current one from an old one)
_published: dict[str, Any] | None = None  # the wait this process last published (the heartbeat shows it too)
_left: dict[str, Any] | None = None  # set by `mark_left`: this process will make no collective again


def running() -> bool:
    """Whether this process's watchdog thread publishes where it waits (so others can read `positions`)."""
    return _store is not None


def published() -> dict[str, Any] | None:
    """The wait this process last published (None: not waiting, or no watchdog).

    Example:
        >>> published() is None
        True
    """
    return _published


def positions() -> list[dict[str, Any] | None]:
    """What every process last published: ``{"seq": n, "wait": {...} or None}``; None where nothing was published.

    Example:
        >>> positions()  # no watchdog in this process
        []
    """
    if _store is None:
        return []
    try:
        keys = [_KEY.format(r) for r in range(_world_size)]
        return [json.loads(_store.get(k)) if _store.check([k]) else None for k in keys]
    except Exception:  # noqa: BLE001 - the store may be gone too
        return []


_progress: Callable[[], list[int] | None] | None = None


def set_progress(source: Callable[[], list[int] | None] | None) -> None:
    """Where this process's training got (e.g. batches taken from each training loader), published once a second.

    Example:
        >>> set_progress(lambda: [3]); local_progress()
        [3]
        >>> set_progress(None)
    """
    global _progress
    _progress = source


def local_progress() -> list[int] | None:
    """This process's progress now (None when there is no source)."""
    try:
        return None if _progress is None else _progress()
    except Exception:  # noqa: BLE001 - read from another thread while the loop changes it: skip this look
        return None


def progress_of(rank: int) -> dict[str, Any] | None:
    """What `rank` last published of its progress: ``{"seq": n, "counts": [...]}`` (None when nothing)."""
    key = _PROGRESS_KEY.format(rank)
    try:
        return json.loads(_store.get(key)) if _store is not None and _store.check([key]) else None
    except Exception:  # noqa: BLE001
        return None


def _waits() -> list[dict[str, Any] | None]:
    return [None if p is None else p.get("wait") for p in positions()]


def describe(rank: int, wait: dict[str, Any] | None) -> str:
    """One process's position in words (for reports and error messages)."""
    if wait is None:
        return f"rank {rank} is elsewhere (computing, or waiting where hasten cannot see)"
    if wait.get("kind") == "left":
        return f"rank {rank} (pid {wait.get('pid', '?')} on {wait.get('host', '?')}) {wait['op']}"
    number = f" (collective #{wait['n']})" if wait.get("n") is not None else ""
    return f"rank {rank} waits in {wait['op']} at {wait['site']}{number}"


def enter(operation: str, depth: int = 2, counted: bool = True) -> None:
    """Mark this process as waiting in `operation` (called at the start of every explicit collective).

    `counted=False` for an operation that not every process makes the same
    number of times (save_state may be called on the main process only), so
    the numbers of the counted ones stay equal across processes.
    """
    global _count, _current
    if counted:
        _count += 1
    _current = (_count if counted else None, operation, sys._getframe(depth), time.monotonic())


def here() -> dict[str, Any] | None:
    """Where this process waits now in one of hasten's collectives, as published (None: in none).

    Example:
        >>> here() is None
        True
    """
    current = _current
    return None if current is None else {"kind": "hasten", "n": current[0], "op": current[1],
                                         "site": call_site(current[2])}


def leave() -> None:
    global _current
    _current = None


class waiting:  # noqa: N801 - used like a function: `with waiting("gather"):`
    """Context manager: this process waits in `operation` for the duration of the block.

    Example:
        >>> with waiting("gather"):
        ...     pass
    """

    __slots__ = ("operation", "counted")

    def __init__(self, operation: str, counted: bool = True) -> None:
        self.operation = operation
        self.counted = counted

    def __enter__(self) -> None:
        enter(self.operation, depth=3, counted=self.counted)

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        mine = _current
        leave()
        if exc is not None and _is_timeout(exc):
            where = _waits()
            if where:  # a plain stall reached the process group's timeout: say where every process was
                if mine is not None:  # this process's own position, not what its watchdog last published
                    where[_rank] = {"n": mine[0], "op": mine[1], "site": call_site(mine[2])}
                described = "; ".join(describe(r, w) for r, w in enumerate(where))
                raise CollectiveTimeout(f"{self.operation} timed out: {described} "
                                        f"(torch: {str(exc).splitlines()[0][:160]})") from exc


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # hasten/, not hasten/process/


def call_site(frame: FrameType | None) -> str:
    """file:line of the first frame at or above `frame` that is outside hasten (the user's call)."""
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame = frame.f_back
    return "?" if frame is None else f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


# -- where the main thread is blocked, seen from the watchdog thread ------------------------------
class _Paths:
    """The library folders a stack is classified by (found once, when the watchdog starts)."""

    def __init__(self) -> None:
        import torch

        self.torch = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
        self.c10d = os.path.join(self.torch, "distributed", "distributed_c10d.py")
        # Modules whose frames on the stack mean a wait for other processes when the process is idle.
        self.collective_dirs = tuple(os.path.join(self.torch, *p) for p in (
            ("distributed", "fsdp", ""), ("distributed", "algorithms", ""), ("nn", "parallel", "distributed.py")))
        self.autograd = os.path.join(self.torch, "autograd", "")
        self.libraries: tuple[str, ...] = (self.torch, _PACKAGE_DIR + os.sep)
        deepspeed = sys.modules.get("deepspeed")
        deepspeed_file = getattr(deepspeed, "__file__", None)
        if deepspeed_file:
            root = os.path.dirname(os.path.abspath(deepspeed_file)) + os.sep
            self.collective_dirs += (os.path.join(root, "comm", ""),)
            self.libraries += (root,)


_paths: _Paths | None = None


def user_site(frame: FrameType | None) -> str:
    """file:line of the innermost frame at or above `frame` outside torch, hasten and DeepSpeed (the user's line)."""
    libraries = _paths.libraries if _paths is not None else (_PACKAGE_DIR + os.sep,)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith("<") and not os.path.abspath(name).startswith(libraries):
            return f"{os.path.basename(name)}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def _torch_wait(frame: FrameType | None, cuda: bool) -> tuple[str, str] | None:
    """(operation, user's file:line) when the stack is inside a collective hasten did not start, else None."""
    assert _paths is not None
    top = frame
    c10d = other = None
    backward = False
    while frame is not None:
        name = frame.f_code.co_filename
        if name == _paths.c10d:
            c10d = frame.f_code.co_name  # the outermost one: all_gather_object, not the all_gather inside it
        elif other is None and name.startswith(_paths.collective_dirs):
            other = frame.f_code.co_name
        elif name.startswith(_paths.autograd) and frame.f_code.co_name in ("backward", "_engine_run_backward"):
            backward = True
        frame = frame.f_back
    if c10d is not None:
        return f"torch.distributed.{c10d}", user_site(top)
    if other is not None:
        return f"torch.distributed ({other})", user_site(top)
    if backward and not cuda:  # on a CPU-only process an idle backward waits for its gradient all-reduce
        return "backward (gradient all-reduce)", user_site(top)
    return None


class _Looker:
    """This process's position, judged from the watchdog thread: a hasten wait, a blocked torch wait, or None."""

    def __init__(self) -> None:
        self.main = threading.main_thread().ident
        self.key: tuple[str, str] | None = None
        self.since = 0.0
        self.cpu_since = 0.0

    def position(self, now: float) -> dict[str, Any] | None:
        if _left is not None:
            return _left
        current = _current
        if current is not None:
            number, operation, frame, since = current
            if now - since < _PUBLISH_AFTER:
                return None
            return {"kind": "hasten", "n": number, "op": operation, "site": call_site(frame)}
        import torch

        frame = sys._current_frames().get(self.main) if self.main is not None else None
        key = _torch_wait(frame, torch.cuda.is_initialized())
        del frame
        cpu = time.process_time()
        if key != self.key:
            self.key, self.since, self.cpu_since = key, now, cpu
            return None
        if key is None:
            return None
        if cpu - self.cpu_since > _FLAT * max(now - self.since, _LOOK_EVERY):  # computing: start over
            self.since, self.cpu_since = now, cpu
            return None
        if now - self.since < _PUBLISH_AFTER:
            return None
        return {"kind": "torch", "n": None, "op": key[0], "site": key[1]}


def start(store: Any, rank: int, world_size: int) -> threading.Thread | None:
    """Start this process's watchdog thread (once per process; needs the process group's store)."""
    global _store, _world_size, _rank, _paths
    if store is None or world_size < 2 or not watchdog_enabled():
        return None
    _paths = _Paths()
    _store, _world_size, _rank = store, world_size, rank
    thread = threading.Thread(target=_watch, args=(store, rank, world_size), name="hasten-watchdog", daemon=True)
    thread.start()
    return thread


def _place(wait: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two waits the same place: hasten's number and operation; for torch's, the operation."""
    return (wait["kind"], wait.get("n"), wait["op"])


def mark_left(what: str = "left the script") -> None:
    """Publish at once that this process will make no collective again (`what` it did, in words); idempotent.

    Called by the per-rank wrapper when the script returned, and by the
    exit of a process group; a process that waits in a collective while
    another has left ends the run naming both (see the module doc).

    Example:
        >>> mark_left()  # no watchdog in this process: nothing to publish
    """
    global _left
    if _left is not None or _store is None:
        return
    import socket

    _left = {"kind": "left", "n": None, "op": what, "site": "", "pid": os.getpid(), "host": socket.gethostname()}
    try:  # written here, not by the watchdog thread: the process may be gone before the thread's next look
        _publish(_store, _KEY.format(_rank), _left)
        _store.set(_LEFT_KEY.format(_rank), json.dumps(_left))
    except Exception:  # noqa: BLE001 - the store may be gone (the run is ending)
        pass


def leave_together(timeout: float) -> bool | None:
    """The exit rendezvous: mark this process as left, then wait until every process has; None without a watchdog.

    Distinct from every collective (store keys of its own), so a process
    that leaves can never complete another one's `wait_for_everyone`;
    while it waits, it is seen as left (see `mark_left`). False when not
    every process arrived within `timeout` seconds.
    """
    if _store is None:
        return None
    mark_left()
    keys = [_LEFT_KEY.format(r) for r in range(_world_size)]
    deadline = time.monotonic() + timeout
    try:
        while not _store.check(keys):
            if time.monotonic() > deadline:
                return False
            time.sleep(_LEFT_POLL)
    except Exception:  # noqa: BLE001 - the store is gone: the others cannot be waited for
        return False
    return True


def _publish(store: Any, key: str, wait: dict[str, Any] | None) -> None:
    global _seq, _published
    _seq += 1
    store.set(key, json.dumps({"seq": _seq, "wait": wait}))
    _published = wait


def _watch(store: Any, rank: int, world_size: int) -> None:
    looker = _Looker()
    key = _KEY.format(rank)
    published: dict[str, Any] | None = None
    last_publish, last_read, last_progress, progress_seq = 0.0, 0.0, 0.0, 0
    progress: list[int] | None = None
    suspect: tuple[float, list[tuple[Any, ...]]] | None = None  # (since, places) of a possible deadlock
    while True:
        time.sleep(_LOOK_EVERY)
        now = time.monotonic()
        wait = looker.position(now)
        try:
            if now - last_progress >= _PROGRESS_EVERY:
                last_progress = now
                current = local_progress()
                if current is not None and current != progress:
                    progress_seq += 1
                    store.set(_PROGRESS_KEY.format(rank), json.dumps({"seq": progress_seq, "counts": current}))
                    progress = current
            if wait != published or (wait is not None and now - last_publish >= _HEARTBEAT):
                _publish(store, key, wait)
                published, last_publish = wait, now
            if wait is None:
                suspect = None
                continue
            if now - last_read < _READ_EVERY:
                continue
            last_read = now
            if store.check([_VERDICT]):  # another process found the deadlock first: report it too, at once
                _report(rank, store.get(_VERDICT).decode(), store)
            others = [json.loads(store.get(_KEY.format(r))).get("wait") if store.check([_KEY.format(r)]) else None
                      for r in range(world_size)]
        except Exception:  # noqa: BLE001 - the store is gone (the run is ending): nothing to watch
            return
        if any(o is None for o in others):
            suspect = None
            continue
        waits: list[dict[str, Any]] = [o for o in others if o is not None]  # all of them: none is None here
        places = [_place(o) for o in waits]
        if all(o["kind"] == "left" for o in waits):  # every process is leaving: the end of a run
            suspect = None
        elif len(set(places)) < 2:
            suspect = None
        elif suspect is None or suspect[1] != places:
            suspect = (now, places)
        elif now - suspect[0] >= _VERDICT_AFTER:
            _report(rank, _summary(waits), store)


def _summary(where: list[dict[str, Any]]) -> str:
    gone = [r for r, w in enumerate(where) if w["kind"] == "left"]
    if gone:  # some left, the others wait in a collective they can never complete
        stay = [describe(r, w) for r, w in enumerate(where) if r not in gone]
        return (" and ".join(describe(r, where[r]) for r in gone) + " while " + " and ".join(stay)
                + f", which {'it' if len(gone) == 1 else 'they'} will never join")
    parts = [describe(r, w)[len(f"rank {r} "):] for r, w in enumerate(where)]
    return ("the processes wait in different collectives, so none can continue: "
            + " while ".join(f"rank {r} {part}" for r, part in enumerate(parts)))


def _report(rank: int, summary: str, store: Any) -> None:
    import traceback

    from .exit import exit_now, is_hidden, record_failure

    try:
        store.set(_VERDICT, summary)  # the other processes report at their next read, within a second
    except Exception:  # noqa: BLE001
        pass
    stacks = []
    for thread_id, frame in sys._current_frames().items():
        if thread_id == threading.get_ident():
            continue  # this watchdog
        entries = [e for e in traceback.extract_stack(frame) if not is_hidden(e.filename)]
        stacks.append("".join(traceback.format_list(entries)))
    if _left is None:  # a process that left is not stuck: its stack (the exit) tells nothing
        sys.stderr.write(f"[hasten] rank {rank} is stuck here:\n" + "\n".join(stacks))  # one write: no interleaving
        sys.stderr.flush()
    # Every process prints its stacks before the first exit stops the others; one that left reports last, so the
    # launcher names a waiting one first.
    time.sleep(_READ_EVERY + 2 * _LOOK_EVERY + (1.0 if _left is not None else 0.0))
    record_failure(CollectiveDeadlock(summary))
    exit_now(1)
