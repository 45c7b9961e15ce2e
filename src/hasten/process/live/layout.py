"""A step's quorum as hasten reads it: the group size and this process's rank, hence its `ElasticLayout`; and the
one line printed when the group changes. Pure: no torch, no torchft.

Example:
    >>> before = LiveQuorum(step=11, replicas=2, replica_rank=0, quorum_id=3)
    >>> after = LiveQuorum(step=11, replicas=1, replica_rank=0, quorum_id=4)
    >>> after.layout(max_processes=2, accumulation=2).own()   # alone: all 4 micro-batches of the step
    4
    >>> live_line(before, after, seconds=1.16, redone=1)
    'hasten: live group changed: 2 -> 1 machine(s) at optimizer step 11 (quorum 4, +1.16 s); 1 step attempt(s) dealt again, nothing restarted'
"""

from __future__ import annotations

from dataclasses import dataclass

from ..elastic import ElasticLayout

__all__ = ["LiveQuorum", "live_line"]


@dataclass(frozen=True)
class LiveQuorum:
    """Who trains the next optimizer step: `replicas` machines, this one being `replica_rank` of them, at committed
    optimizer step `step` (the same on every member once healed); `healed`: this process's state was just received
    from a peer (a joiner).

    Example:
        >>> quorum = LiveQuorum(step=0, replicas=3, replica_rank=2)
        >>> quorum.processes(processes_per_machine=2), quorum.rank(processes_per_machine=2, local_rank=1)
        (6, 5)
    """

    step: int
    replicas: int
    replica_rank: int
    quorum_id: int = 0
    healed: bool = False

    def processes(self, processes_per_machine: int = 1) -> int:
        """P: the processes training this step."""
        return self.replicas * processes_per_machine

    def rank(self, processes_per_machine: int = 1, local_rank: int = 0) -> int:
        """This process's rank among the P of this step (machines in the quorum's order, then local ranks)."""
        return self.replica_rank * processes_per_machine + local_rank

    def layout(self, max_processes: int, accumulation: int, processes_per_machine: int = 1,
               local_rank: int = 0) -> ElasticLayout:
        """How this step's M = max_processes x accumulation micro-batches are dealt over this quorum."""
        return ElasticLayout(max_processes, self.processes(processes_per_machine),
                             self.rank(processes_per_machine, local_rank), accumulation)


def live_line(before: LiveQuorum | None, after: LiveQuorum, seconds: float | None = None, redone: int = 0) -> str | None:
    """The line printed when the group changes between two steps' quorums (None: same group, nothing to say).

    Example:
        >>> live_line(None, LiveQuorum(step=7, replicas=2, replica_rank=1, quorum_id=2, healed=True))
        'hasten: live group changed: ? -> 2 machine(s) at optimizer step 7 (quorum 2); this machine joined: state received from a live peer, nothing read from disk'
    """
    if before is not None and before.quorum_id == after.quorum_id and not after.healed:
        return None
    if before is not None and before.replicas == after.replicas and not after.healed and not redone:
        return None
    size = f"{before.replicas if before is not None else '?'} -> {after.replicas} machine(s)"
    timing = f", +{seconds:.2f} s" if seconds is not None else ""
    parts = [f"hasten: live group changed: {size} at optimizer step {after.step} (quorum {after.quorum_id}{timing})"]
    if redone:
        parts.append(f"{redone} step attempt(s) dealt again, nothing restarted")
    if after.healed:
        parts.append("this machine joined: state received from a live peer, nothing read from disk")
    return "; ".join(parts)
