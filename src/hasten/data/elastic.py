"""A training loader's batches in an elastic run: the micro-batches of each step dealt out over the group.

In an elastic run (`hasten launch --num_machines MIN:MAX`) an optimizer step
is M = MAX processes x accumulation micro-batches of the run's global order,
the batches the uninterrupted run at MAX reads (padded at MAX, as it pads).
At P processes the j-th micro-batch of a step goes to process ``j % P``
(`hasten.process.elastic.ElasticLayout`); when P divides M this is plain
sharding over P, and when it does not, some processes take one more.

Only a training pass is dealt that way: a pass that starts while the run's
trained models are in evaluation mode (``model.eval()``), and that is not
the pass of a loader already seen feeding `backward`, is sharded plainly
over P, so every process gets as many batches and `gather_for_metrics`
gives the dataset back exactly once.

Example:
    >>> from torch.utils.data import BatchSampler
    >>> from hasten.process.elastic import ElasticLayout
    >>> class Run:
    ...     layout = ElasticLayout(max_processes=3, processes=2, rank=1, accumulation=1)
    ...     def training_pass(self): return True
    >>> inner = BatchSampler(range(12), batch_size=2, drop_last=False)
    >>> list(ElasticBatchSampler(inner, Run()))   # steps (0 1 2)(3 4 5): process 1 takes batches 1 and 4
    [[2, 3], [8, 9]]
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Protocol

from ..process.elastic import ElasticLayout, MicroBatch
from .sharding import ShardedBatchSampler

__all__ = ["ElasticBatchSampler", "ElasticSource"]


class ElasticSource(Protocol):
    """What an elastic loader reads of the run (the facade's `ElasticRun`): the layout now, and whether a pass that
    starts now trains."""

    @property
    def layout(self) -> ElasticLayout: ...

    def training_pass(self) -> bool: ...


class ElasticBatchSampler(ShardedBatchSampler):
    """This process's batches in an elastic run (see the module doc); a `ShardedBatchSampler` over the group's size.

    `len()` and iteration follow the mode of the pass (`begin_pass`): dealt
    micro-batches for a training pass, plain sharding otherwise.
    """

    def __init__(self, batch_sampler: Iterable[list[int]], source: ElasticSource) -> None:
        layout = source.layout
        super().__init__(batch_sampler, layout.processes, layout.rank, split_batches=False, even_batches=True)
        self.source = source
        self.training: bool | None = None  # the mode of the pass under way (None: decided when it starts)
        self._skip_own = 0  # micro-batches of the first step a seek leaves out (a resume inside a step)
        self._start_step = 0

    @property
    def layout(self) -> ElasticLayout:
        return self.source.layout

    def dealt(self) -> bool:
        """Is the pass under way (or the next one) a training pass, whose micro-batches are dealt out?"""
        return self.training if self.training is not None else self.source.training_pass()

    def begin_pass(self, training: bool) -> None:
        """The loader starts a pass: a training pass (`training`) is dealt, another one is sharded plainly."""
        self.training = training or self.source.training_pass()

    def micro_batches_per_pass(self) -> int | None:
        """Micro-batches of a whole pass at MAX processes, padding included (None when the sampler has no length)."""
        try:
            inner = len(self.batch_sampler)  # type: ignore[arg-type]
        except TypeError:
            return None
        windows = self.layout.max_processes
        return (inner // windows if self.drop_last else -(-inner // windows)) * windows

    def at(self, index: int) -> MicroBatch | None:
        """This process's micro-batch number `index` of the pass (None outside a training pass)."""
        if not self.training:
            return None
        return self.layout.at(index, self.micro_batches_per_pass())

    def __len__(self) -> int:
        total = self.micro_batches_per_pass()
        if not self.dealt() or total is None:
            return super().__len__()
        return self.layout.own_before(total)

    def seek(self, batches: int) -> bool:
        if not self.dealt():
            return super().seek(batches)
        layout = self.layout
        step, self._skip_own = divmod(batches, layout.own())
        if not super().seek(0):  # (an order that cannot seek: the loader skips by reading)
            return False
        order: Any = self.sampler
        order.seek(min(step * layout.micro_batches * int(self.batch_size or 0), order.num_samples))
        self._start_step = step
        return True

    def __iter__(self) -> Iterator[list[int]]:
        if not self.dealt():
            yield from super().__iter__()
            return
        seeked, self._seeked = self._seeked, False
        layout = self.layout
        per_step, rank = layout.micro_batches, layout.rank
        skip = self._skip_own if seeked else 0
        micro = self._start_step * per_step if seeked else 0
        self._skip_own = self._start_step = 0
        for window in self._windows(layout.max_processes, seeked):
            for batch in window:
                if layout.owner(micro % per_step) == rank:
                    if skip:
                        skip -= 1
                    else:
                        yield batch
                micro += 1
