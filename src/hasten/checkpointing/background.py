"""`save_state(..., async_save=True)`: copy the state now, write and publish it on a background thread.

The training thread takes a `snapshot.Snapshot` of the state (the small
state copied at once; the parameters and optimizer state copied by the
writer thread before anything else, every optimizer step waiting for that
copy, so the next step cannot change what is written); the files, their
hashes, the manifest and the atomic rename happen on the writer thread,
with the same functions and values a synchronous save uses, so the
published folder is the same bit for bit.

The processes agree on the outcome through the rendezvous store, never
through a collective: a collective from the writer thread could interleave
with the training thread's own. Each process posts its files (or its
error); the publishing process waits for every post, writes the manifest,
renames the folder into place and posts the outcome, which the others'
writer threads wait for.

At most one save is in flight: a second `save_state` (and `load_state`, and
a preemption save) first waits for the pending one; leaving the process group (the end
of a launched script) and interpreter exit wait too, so a finished run
never leaves a checkpoint half-written.
"""

from __future__ import annotations

import atexit
import itertools
import json
import queue
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from ..process import group
from .commit import CheckpointError

__all__ = ["AsyncSave", "exchange", "next_number", "pending", "run_in_background", "wait_pending"]

_KEY = "hasten/async_save/{number}/{what}"
_numbers = itertools.count()  # every process starts async saves in the same order: the same number everywhere
_pending: AsyncSave | None = None


class AsyncSave(str):
    """The directory an asynchronous `save_state` is writing (a `str`, as a synchronous save returns), and its handle.

    `wait()` blocks until the checkpoint is published (and returns its path)
    or raises the save's error; `done()` says whether it is over.

    Example:
        >>> import tempfile, torch
        >>> from hasten import Accelerator
        >>> accelerator = Accelerator(cpu=True)
        >>> model = accelerator.prepare(torch.nn.Linear(2, 2))
        >>> handle = accelerator.save_state(tempfile.mkdtemp() + "/ckpt", async_save=True)
        >>> handle.wait() == handle  # published: the same folder a synchronous save writes
        True
    """

    _done: threading.Event
    _error: BaseException | None

    def wait(self, timeout: float | None = None) -> str:
        """Block until the checkpoint is published; raise its error if it failed (or TimeoutError after `timeout` s)."""
        global _pending
        if not self._done.wait(timeout):
            raise TimeoutError(f"the asynchronous save of {str(self)} is still writing after {timeout:g} s.")
        if _pending is self:  # waited for: the next save need not wait again, nor raise this error again
            _pending = None
        if self._error is not None:
            raise self._error
        return str(self)

    def done(self) -> bool:
        """Whether the background write is over (published or failed)."""
        return self._done.is_set()


def pending() -> AsyncSave | None:
    """The save still being written by this process, if any."""
    return _pending if _pending is not None and not _pending.done() else None


def wait_pending() -> None:
    """Wait for this process's pending asynchronous save, raising its error (each error is raised once)."""
    global _pending
    handle, _pending = _pending, None
    if handle is not None:
        handle.wait()


def _wait_quietly() -> None:
    """At the end of the run: finish the pending save; a failure is said on stderr (raising from teardown helps nobody)."""
    try:
        wait_pending()
    except Exception as failure:  # noqa: BLE001
        print(f"[hasten] the asynchronous save_state failed and nobody waited for it: {failure}", file=sys.stderr,
              flush=True)


_jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
_writer: threading.Thread | None = None


def _serve() -> None:
    while True:
        _jobs.get()()


def run_in_background(target: Path, work: Callable[[], None]) -> AsyncSave:
    """Hand `work` (write, agree, publish) to the writer thread; returns the handle, also kept as the pending save.

    The writer is one thread for the process, started at the first save: starting a thread waits until it runs,
    which on a machine whose cores are busy training held each save's caller for milliseconds.
    """
    global _pending, _writer
    handle = AsyncSave(str(target))
    handle._error = None
    handle._done = threading.Event()

    def body() -> None:
        try:
            _yield_to_training()
            work()
        except BaseException as failure:  # noqa: BLE001 - kept for wait(), raised on the training thread
            handle._error = failure
        finally:
            handle._done.set()

    _pending = handle
    _jobs.put(body)
    if _writer is None or not _writer.is_alive():  # (the first save, or a child process forked since)
        # daemon: a failed run must still be able to exit; a successful one waits (group.before_leaving, atexit)
        _writer = threading.Thread(target=_serve, name="hasten-async-save", daemon=True)
        _writer.start()
    return handle


def cores_left_for_the_writer() -> int:
    """The cores this machine's training leaves idle: usable cores minus torch's threads on every local process.

    Example:
        >>> isinstance(cores_left_for_the_writer(), int)
        True
    """
    import os

    import torch

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return usable - torch.get_num_threads() * local


_said = False


def _yield_to_training() -> None:
    """(Writer thread.) Run below the training's priority, so a save never slows training down (Linux).

    The writer (and the hashing thread it starts, which inherits this)
    takes the CPU the training leaves: a free core, or the moments training
    waits. Where training keeps every core busy, the save then progresses
    mostly when the next save, `load_state` or the end of the run waits for
    it, which is said once: never slower than a synchronous save, as the
    work is the same.
    """
    global _said
    import os

    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread only (Linux: a thread id)
    except (AttributeError, OSError):
        return
    if not _said and cores_left_for_the_writer() < 1 and os.environ.get("RANK", "0") == "0":
        _said = True
        print("hasten: save_state(async_save=True) shares the CPUs with training (every core is busy with torch's "
              "threads), so it writes at low priority, when training leaves a core idle; it is finished at the "
              "latest when the next save, load_state or the end of the run waits for it. Leave a core free "
              "(torch.set_num_threads) to overlap it with training.", file=sys.stderr, flush=True)


def exchange(number: int, rank: int, world: int, publisher: bool, report: Any,
             publish: Callable[[list[Any]], str | None], timeout: float) -> None:
    """Agree on one asynchronous save's outcome through the store: every report reaches the publisher, its verdict everyone.

    `publish` (run by the publishing process with every process's report)
    returns None when the checkpoint is in place, else the error every
    process raises.
    """
    import datetime

    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    store.set(_KEY.format(number=number, what=f"report{rank}"), json.dumps(report))
    outcome_key = _KEY.format(number=number, what="outcome")
    if publisher:
        keys = [_KEY.format(number=number, what=f"report{r}") for r in range(world)]
        store.wait(keys, datetime.timedelta(seconds=timeout))
        reports = [json.loads(store.get(key)) for key in keys]
        store.set(outcome_key, json.dumps({"error": publish(reports)}))
    else:
        store.wait([outcome_key], datetime.timedelta(seconds=timeout))
    error = json.loads(store.get(outcome_key))["error"]
    if error is not None:
        raise CheckpointError(error)


def next_number() -> int:
    """The number of the next asynchronous save (the same on every process: they start saves in the same order)."""
    return next(_numbers)


group.before_leaving(_wait_quietly)  # the end of a launched script: before the exit rendezvous and destroy
atexit.register(_wait_quietly)  # a script without a process group
