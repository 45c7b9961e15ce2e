"""Who takes part in a save: every process, or the main process alone — found out without a collective.

Accelerate's `save_state` makes no collective with an explicit directory,
so scripts call it inside ``if accelerator.is_main_process:`` (85 of the 91
diffusers examples that checkpoint do). hasten's save agrees across
processes when they all save (every file checked before the checkpoint is
published, one error everywhere), so the main process must first learn
whether the others are saving too — and a collective would hang when they
are not. The rendezvous store answers instead:

- a non-main process that calls `save_state` posts its *arrival* (its n-th
  save) and waits for the main process's answer;
- the main process waits, for each other process, until it has either
  arrived, or shows it is not coming, as published by its watchdog: it
  took a training batch the main process has not taken yet (it went past
  this save; `hasten.process.watchdog.progress_of`), or it is blocked in a
  collective *after* this save began (`hasten.process.watchdog.positions`) — a
  process waiting for the main process cannot be coming. Its arrival slot
  is then marked refused (an atomic compare-and-set, so an arrival and a
  refusal cannot both win), and the main process saves alone.

So a save costs a few store round trips when every process saves, and
about 1–2 seconds when only the main process does (the time for the others'
watchdogs to publish). With no sign either way for `GRACE` seconds (no
prepared training loader, and a wait the watchdog cannot see, such as a
CUDA process spinning in a synchronisation), or `GRACE_WITHOUT_WATCHDOG`
seconds without watchdogs (``HASTEN_WATCHDOG=0``), it saves alone and says so.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from ..process import watchdog

__all__ = ["Decision", "decide", "join", "answer", "GRACE_WITHOUT_WATCHDOG"]

GRACE_WITHOUT_WATCHDOG = 10.0
GRACE = 60.0  # no sign either way for this long (a CUDA process spinning in a sync, no prepared loader): go alone
_SLOT = "hasten/save/{rank}/{number}"
_ANSWER = "hasten/save/{rank}/{number}/answer"
_REFUSED = "refused"
_POLL = 0.02

_arrivals = 0  # saves this (non-main) process called
_consumed: dict[int, int] = {}  # main process: arrivals of each other process used so far
_sessions = 0  # main process: saves so far


def _store() -> Any:
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_store()


@dataclass
class Decision:
    """The main process's view of one save: who arrived (their requests) and who is not coming (why, in words)."""

    session: int
    joined: dict[int, dict[str, Any]] = field(default_factory=dict)
    absent: dict[int, str] = field(default_factory=dict)  # rank -> why it is not part of this save

    @property
    def everyone(self) -> bool:
        return not self.absent


def _get(store: Any, key: str) -> str | None:
    return store.get(key).decode() if store.check([key]) else None


def decide(num_processes: int, site: list[str]) -> Decision:
    """(Main process.) Wait until every other process has arrived or is seen waiting elsewhere; never blocks on them.

    An arrival counts for this save when it comes from the same lines of the script (`site`, the user's call
    stack): a process that called save_state from other lines waits for a later save of the main process.
    """
    global _sessions
    _sessions += 1
    store = _store()
    decision = Decision(_sessions)
    pending = set(range(1, num_processes))
    start = time.monotonic()
    baseline = {r: (p or {}).get("seq", 0) for r, p in enumerate(watchdog.positions()) if r in pending}
    mine = watchdog.local_progress()
    progress_base = {r: (watchdog.progress_of(r) or {}).get("seq", 0) for r in pending} if watchdog.running() else {}
    use_watchdog = watchdog.running()
    seen: list[dict[str, Any] | None] = []
    polls = 0
    while pending:
        if use_watchdog and polls % 5 == 0:  # positions change at most every quarter second
            seen = watchdog.positions()
        polls += 1
        for rank in sorted(pending):
            slot = _SLOT.format(rank=rank, number=_consumed.get(rank, 0) + 1)
            value = _get(store, slot)
            arrival = None if value is None or value.startswith(_REFUSED) else json.loads(value)
            if arrival is not None and arrival["site"] == site:
                decision.joined[rank] = arrival
                pending.discard(rank)
                continue
            position = seen[rank] if rank < len(seen) else None
            # Two publications after this save began: the second one's look was taken after it began.
            why = None
            if position is not None and position.get("wait") is not None and position["seq"] >= baseline.get(rank, 0) + 2:
                why = watchdog.describe(rank, position["wait"])
            elif (use_watchdog and polls % 5 == 1
                  and _ahead(watchdog.progress_of(rank), progress_base.get(rank, 0), mine)):
                # since this save began it took a training batch the main process has not: it went past this save
                why = f"rank {rank} went on to its next training batch"
            elif time.monotonic() - start >= (GRACE if use_watchdog else GRACE_WITHOUT_WATCHDOG):
                why = f"rank {rank} showed no sign of calling it within {time.monotonic() - start:.0f} s"
                print(f"hasten: {why}; the main process saves alone.", flush=True)
            if why is None:
                continue
            if arrival is not None:  # it waits in a save_state called from other lines: a later save of the main's
                decision.absent[rank] = why
                pending.discard(rank)
                continue
            refusal = f"{_REFUSED}:{decision.session}"
            if store.compare_set(slot, value or "", refusal).decode() == refusal:
                decision.absent[rank] = why
                pending.discard(rank)
            # else it arrived in between: looked at again on the next round
        if pending:
            time.sleep(_POLL)
    for rank in decision.joined:
        _consumed[rank] = _consumed.get(rank, 0) + 1
    return decision


def _ahead(theirs: dict[str, Any] | None, base: int, mine: list[int] | None) -> bool:
    """Whether a process published, after this save began (`base`: its publication number then), that its
    training loaders handed out more batches than the main process's (the same loaders)."""
    if not theirs or theirs["seq"] <= base or not mine:
        return False  # an older publication may be of loaders (or an Accelerator) the process no longer uses
    counts = theirs["counts"]
    return len(counts) == len(mine) and any(t > m for t, m in zip(counts, mine))


def answer(decision: Decision, reply: dict[str, Any]) -> None:
    """(Main process.) Tell every process that arrived what happens (same reply for all)."""
    store = _store()
    body = json.dumps(reply)
    for rank in decision.joined:
        store.set(_ANSWER.format(rank=rank, number=_consumed[rank]), body)


def join(rank: int, request: dict[str, Any]) -> dict[str, Any]:
    """(Non-main process.) Post this arrival, then wait for the main process's reply (marked as a wait in save_state)."""
    global _arrivals
    _arrivals += 1
    store = _store()
    slot = _SLOT.format(rank=rank, number=_arrivals)
    body = json.dumps(request)
    current = ""
    while True:  # a refusal left from an earlier save the main process made alone is replaced
        won = store.compare_set(slot, current, body).decode()
        if won == body:
            break
        current = won
        if not won.startswith(_REFUSED):
            raise RuntimeError(f"save_state bookkeeping is out of step on process {rank} ({slot} holds {won!r}).")
    key = _ANSWER.format(rank=rank, number=_arrivals)
    with watchdog.waiting("save_state", counted=False):
        delay = 0.001
        while not store.check([key]):
            time.sleep(delay)
            delay = min(2 * delay, 0.02)
    reply = json.loads(store.get(key))
    for done in (key, slot):
        try:
            store.delete_key(done)
        except Exception:  # noqa: BLE001 - a store without deletion keeps two small keys
            pass
    return reply
