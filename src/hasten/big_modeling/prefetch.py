"""Bring the next offloaded module's weights in on a background thread while the current module computes.

A disk-offloaded forward reads each module's weights just before it runs.
Done in line, the reading (page faults into a memory mapping, or disk I/O on
a cold cache) stops the computation; done one module ahead on a second
thread, it overlaps with it. The order is learnt from the forward itself: the
module that ran after `A` last time is the one fetched while `A` runs. At
most one module's weights are fetched ahead, so memory grows by one module at
most. The numbers are unchanged: the prefetched tensor is the same read-only
mapping a direct read returns.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch

__all__ = ["Prefetcher"]


class Prefetcher:
    """Learns the order modules run in and loads the next module's keys with `load` ahead of time.

    Example:
        >>> loads = []
        >>> p = Prefetcher(lambda key: loads.append(key) or torch.zeros(1))
        >>> p.started("a.", ["a.w"]); p.started("b.", ["b.w"])  # first pass: learns a -> b
        >>> p.started("a.", ["a.w"])  # second pass: b's weights are fetched while a runs
        >>> p.take("b.w"), sorted(loads)
        (tensor([0.]), ['b.w'])
        >>> p.started("b.", ["b.w"]); p.take("a.w") is None  # b -> a is a new forward, not an edge
        True
    """

    def __init__(self, load: Callable[[str], torch.Tensor]) -> None:
        self._load = load
        self._after: dict[str, str] = {}  # module prefix -> the prefix that started after it last time
        self._keys: dict[str, tuple[str, ...]] = {}  # module prefix -> the keys it reads from disk
        self._last: str | None = None
        self._this_pass: set[str] = set()  # the modules started since the current forward began
        self._ahead: dict[str, Future[torch.Tensor]] = {}  # key -> its load, running or done
        self._pool: ThreadPoolExecutor | None = None  # started on first need; called from the forward's thread only
        self._pool_pid = 0

    def take(self, key: str) -> torch.Tensor | None:
        """The tensor fetched ahead for `key` (waiting for it if need be), or None: read it directly."""
        future = self._ahead.pop(key, None)
        if future is None or self._pool_pid != os.getpid():  # fetched by a parent's thread that is not in this process
            return None
        try:
            return future.result()
        except Exception:  # noqa: BLE001 - the direct read that follows raises the real error in the caller's thread
            return None

    def started(self, prefix: str, keys: Sequence[str]) -> None:
        """Module `prefix` (reading `keys`) has its weights: note the order, fetch the module expected next."""
        if not keys:  # a container whose weights its children's hooks read: not a step of the order
            return
        self._keys.setdefault(prefix, tuple(keys))
        if prefix in self._this_pass:  # a module seen again starts a new forward: the wrap is no edge, so
            self._this_pass.clear()    # nothing fetched ahead stays in memory between two forwards
        elif self._last is not None:
            self._after[self._last] = prefix
        self._this_pass.add(prefix)
        self._last = prefix
        self._ahead.clear()  # what was fetched for a module that did not run is dropped, not kept
        following = self._after.get(prefix)
        if following is None:
            return
        pool = self._executor()
        for key in self._keys.get(following, ()):
            self._ahead[key] = pool.submit(self._load, key)

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None or self._pool_pid != os.getpid():
            # A forked child (notebook_launcher, DataLoader workers) inherits the pool but not its thread:
            # work handed to it would never run, so each process starts its own.
            self._ahead.clear()
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hasten-offload-prefetch")
            self._pool_pid = os.getpid()
        return self._pool

    def __getstate__(self) -> dict:
        # A copy (pickle, deepcopy) starts with no thread and nothing fetched, but keeps the learnt order.
        return {**self.__dict__, "_ahead": {}, "_pool": None, "_pool_pid": 0}
