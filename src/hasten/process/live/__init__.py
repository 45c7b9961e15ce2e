"""Live elastic recovery: survivors keep training in memory when a machine leaves or joins (phase 1: DDP, one
process per machine, opt-in through the launch spec's ``live`` field).

torchft decides who is in each optimizer step (a per-step quorum from its lighthouse) and heals a joiner from a live
peer; hasten keeps its step rule (`hasten.process.elastic`): the step's micro-batches are dealt over the quorum, the
gradients are averaged by one flat all-reduce (`LiveReducer`), and a step whose all-reduce failed anywhere does not
commit and is dealt again at the new size. Only `membership.py` imports torchft (lazily).

Example:
    >>> from hasten.process.live import LiveQuorum
    >>> LiveQuorum(step=4, replicas=2, replica_rank=1).layout(max_processes=2, accumulation=1).rank
    1
"""

from __future__ import annotations

from .layout import LiveQuorum, live_line
from .membership import LiveGroup, LiveUnavailable
from .reducer import LiveReducer, ReducingGroup

__all__ = ["LiveQuorum", "live_line", "LiveGroup", "LiveUnavailable", "LiveReducer", "ReducingGroup"]
