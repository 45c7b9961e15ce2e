"""A training pass of a live run (`hasten.facade.live`): each step dealt at the size its quorum gives, a step that did
not commit dealt again before anything else.

The pass's micro-batches are the run's global order at MAX processes (the `ElasticBatchSampler`'s windows, padding
included), listed once when the pass starts (index lists only). Before each step's first micro-batch the loader asks
the live group for the step's quorum (`begin_step`), then hands out this process's micro-batches of that step under
the layout it gives. When the loop asks for a batch after a step whose optimizer step did not commit (`live.redo`),
the same step is dealt again at the new size. A machine that joins receives the pass's position (epoch, step in the
pass, what replays the pass's order) from a live peer inside its first quorum, and continues from there.

Phase 1 limits: the batches are read in the training process (``num_workers`` is not used in a live pass), and a
short last step needs at least one micro-batch per process.

Example:
    >>> live_steps(total_micro_batches=10, micro_batches_per_step=4)
    3
"""

from __future__ import annotations

import sys
from typing import Any, Iterator

from ..process.elastic import MicroBatch

__all__ = ["live_pass", "live_steps", "LivePosition"]


def live_steps(total_micro_batches: int, micro_batches_per_step: int) -> int:
    """Optimizer steps in a pass of `total_micro_batches` (the last one may be short)."""
    return -(-total_micro_batches // micro_batches_per_step)


class LivePosition:
    """Where a loader's live pass is: its epoch, the step about to be dealt, what replays the pass's order.

    Example:
        >>> LivePosition(epoch=1, step=5).as_dict()
        {'epoch': 1, 'step': 5, 'order': None}
    """

    def __init__(self, epoch: int = 0, step: int = 0, order: dict[str, Any] | None = None) -> None:
        self.epoch, self.step, self.order = epoch, step, order
        self.handed: int | None = None  # the step of the micro-batch handed out last in this pass

    def steps_done(self, stepped: bool) -> int:
        """The pass's steps done (a checkpoint resumes after them); `stepped`: an optimizer step followed the last
        micro-batch handed out.

        Example:
            >>> position = LivePosition(step=3); position.handed = 3
            >>> position.steps_done(stepped=False), position.steps_done(stepped=True)
            (3, 4)
        """
        return self.step + (stepped and self.handed == self.step)

    def as_dict(self) -> dict[str, Any]:
        """The position as a joiner receives it."""
        return {"epoch": self.epoch, "step": self.step, "order": self.order}


def _pass_batches(loader: Any, elastic: Any, continuing: bool) -> list[list[int]]:
    """The pass's micro-batches at MAX processes, as index lists (the order replays when `continuing`).

    The pass starts as a plain one does (`_start_pass`): the epoch set, the order begun, the loader's generators
    synchronised, and torch's iterator made, which draws its base seed from the loader's generator, the one the
    next epoch's shuffle draws from (without that draw every epoch after the first was dealt in another order than
    the uninterrupted run's). The iterator is not read (a live pass fetches its batches itself), so it is made without
    worker processes.
    """
    loader.cursor.resumed = continuing
    workers = loader.num_workers
    loader.num_workers = 0
    try:
        loader._start_pass(0)
    finally:
        loader.num_workers = workers
    batches = [list(batch) for window in elastic._windows(elastic.layout.max_processes) for batch in window]
    loader._live.order = loader.order.state_dict() if loader.order is not None else None
    loader._live.epoch = loader.cursor.epoch
    return batches


def _fetch(loader: Any, indices: list[int]) -> Any:
    return loader.collate_fn([loader.dataset[i] for i in indices])


def live_pass(loader: Any, elastic: Any, live: Any, position: Any) -> Iterator[Any]:
    """This process's batches of a live training pass of `loader` (a `PreparedDataLoader`); see the module doc."""
    cursor = loader.cursor
    live.attach(loader)
    if loader.num_workers > 0 and not getattr(loader, "_live_workers_said", False):
        loader._live_workers_said = True  # (said once per loader: a setting that is not honoured is never silent)
        sys.stderr.write(f"hasten: live recovery reads a training step's batches in the training process in this "
                         f"version, so the DataLoader's num_workers={loader.num_workers} is not used for training "
                         "passes (evaluation passes use it).\n")
    continuing = cursor.resumed
    cursor.resumed = False
    batches = _pass_batches(loader, elastic, continuing)
    per_step = elastic.layout.micro_batches
    steps = live_steps(len(batches), per_step)
    loader._live.step = step = 0 if not continuing else loader._live.step
    while step < steps:
        loader._live.step = step  # (what a joiner receives, if one heals in this quorum)
        live.begin_step()
        healed, loader._healed = loader._healed, None
        if healed is not None:  # a joiner: continue the peer's pass
            cursor.epoch = int(healed["epoch"])
            if loader.order is not None and healed["order"] is not None:
                loader.order.load_state_dict(healed["order"])
            batches = _pass_batches(loader, elastic, continuing=healed["order"] is not None)
            steps, step = live_steps(len(batches), per_step), int(healed["step"])
            loader._live.step = step
            if step >= steps:
                break
        layout = elastic.layout
        in_step = batches[step * per_step:(step + 1) * per_step]
        mine = [batch for j, batch in enumerate(in_step) if layout.owner(j) == layout.rank]
        for n, indices in enumerate(mine):
            ends = n == len(mine) - 1
            last = ends and step == steps - 1
            batch = loader._finish(_fetch(loader, indices), last)
            if last:
                loader.end_of_dataloader = position.end_of_dataloader = True
            position.micro_batch = MicroBatch(step, ends, 0)
            if loader.gradient_state is not None:  # (a failed commit left it False: each micro-batch says anew)
                loader.gradient_state.sync_gradients = ends
            loader._steps_at_handout = loader._optimizer_steps()
            loader._live.handed = step
            cursor.yielded += 1
            cursor.handed_out += 1
            yield batch
            loader._at_boundary()  # asked for the next batch: steps counted, a periodic save when due
            if live.redo:
                break
        if live.redo:  # the step did not commit: the same step again, at the size of the next quorum
            live.redo = False
            loader.end_of_dataloader = position.end_of_dataloader = False
            continue
        step += 1
    loader._live.step, loader._live.handed = 0, None
    cursor.epoch, cursor.yielded = cursor.epoch + 1, 0
    elastic.training = None
