"""What a world size means in an elastic run: the one place that says it.

An elastic run (`hasten launch --num_machines MIN:MAX`) may train on any
number of machines between MIN and MAX; torch's elastic agent re-forms the
group when machines leave or join. The run's *recipe* is the one at MAX
processes and stays the same at every size:

- an optimizer step is M = MAX processes x accumulation *micro-batches*, the
  batches of the per-process batch size, in the run's global order (the
  batches the uninterrupted run at MAX would read, its padding included);
- at P processes the micro-batches of a step are dealt out in turn: the
  j-th of the step goes to process ``j % P``, so some processes take one
  more than others when P does not divide M (`ElasticLayout`);
- each micro-batch's loss counts ``P / M`` (the backward divides by M / P), so
  the gradient the processes average is the mean over all M, as at MAX;
- the learning-rate schedule advances by optimizer step as at MAX: the
  prepared scheduler steps MAX times per optimizer step, whatever the size.

Every size of every range holds the global batch; nothing is refused for
divisibility.

Example:
    >>> layout = ElasticLayout(max_processes=3, processes=2, rank=1, accumulation=1)
    >>> layout.micro_batches, layout.own(), layout.most, layout.divisor
    (3, 1, 2, 1.5)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["ElasticSizes", "ElasticLayout", "MicroBatch", "parse_machines", "ElasticSizeError"]


class ElasticSizeError(ValueError):
    """A machine range or a group size an elastic run cannot train on (one sentence with the fix)."""


def parse_machines(value: str | int) -> tuple[int, int]:
    """``--num_machines``: ``N`` (a fixed group) or ``MIN:MAX`` (elastic); returns (MIN, MAX).

    Example:
        >>> parse_machines("1:3"), parse_machines(2), parse_machines("2")
        ((1, 3), (2, 2), (2, 2))
        >>> parse_machines("3:1")
        Traceback (most recent call last):
        ...
        hasten.process.elastic.ElasticSizeError: --num_machines 3:1: MIN must be at least 1 and at most MAX; write MIN:MAX, e.g. 1:2.
    """
    text = str(value).strip()
    low, sep, high = text.partition(":")
    try:
        low_n, high_n = int(low), int(high if sep else low)
    except ValueError:
        raise ElasticSizeError(f"--num_machines {text}: give a whole number N, or MIN:MAX for an elastic run "
                               "(e.g. 1:2).") from None
    if not 1 <= low_n <= high_n:
        raise ElasticSizeError(f"--num_machines {text}: MIN must be at least 1 and at most MAX; write MIN:MAX, e.g. 1:2.")
    return low_n, high_n


@dataclass(frozen=True)
class ElasticSizes:
    """The process counts an elastic run may train on.

    `processes_per_machine` is None when the run does not know it (a group
    started by hand): then every count between the two bounds is possible.

    Example:
        >>> ElasticSizes(min_processes=2, max_processes=4, processes_per_machine=2).sizes()
        [2, 4]
    """

    min_processes: int
    max_processes: int
    processes_per_machine: int | None = None

    def sizes(self) -> list[int]:
        """Every group size the run may meet (whole machines when the machine size is known)."""
        step = self.processes_per_machine or 1
        first = -(-self.min_processes // step) * step
        return list(range(first, self.max_processes + 1, step))

    def check_world(self, world: int) -> None:
        """Refuse a group outside the range (a machine started with another command), in one sentence.

        Example:
            >>> ElasticSizes(1, 2).check_world(3)
            Traceback (most recent call last):
            ...
            hasten.process.elastic.ElasticSizeError: this elastic run has 3 processes, outside its range of 1 to 2; start every machine with the same hasten launch command.
        """
        if not self.min_processes <= world <= self.max_processes:
            raise ElasticSizeError(f"this elastic run has {world} processes, outside its range of {self.min_processes} "
                                   f"to {self.max_processes}; start every machine with the same hasten launch command.")

    def layout(self, world: int, rank: int, accumulation: int = 1) -> "ElasticLayout":
        """How this group of `world` processes deals out the micro-batches of a step (see `ElasticLayout`)."""
        self.check_world(world)
        return ElasticLayout(self.max_processes, world, rank, accumulation)


class MicroBatch(NamedTuple):
    """One of a process's micro-batches: its step in the pass, whether it is the process's last of that step, and
    how many micro-batches fewer than the busiest process the step gives this one (`ElasticLayout.at`)."""

    step: int
    ends_step: bool
    short_by: int


@dataclass(frozen=True)
class ElasticLayout:
    """The micro-batches of an optimizer step at `processes` of `max_processes`, as process `rank` sees them.

    A step of a pass starts at micro-batch ``step * micro_batches`` of the
    pass (the counting restarts with each pass, as Accelerate's accumulation
    count does at the end of a loader); its j-th micro-batch belongs to
    process ``j % processes``. The last step of a pass may be shorter.

    Example:
        >>> layout = ElasticLayout(max_processes=4, processes=3, rank=2, accumulation=1)
        >>> [layout.owner(j) for j in range(4)], layout.own(), layout.most
        ([0, 1, 2, 0], 1, 2)
        >>> layout.own_before(8), layout.at(1, total=8)
        (2, MicroBatch(step=1, ends_step=True, short_by=1))
    """

    max_processes: int
    processes: int
    rank: int
    accumulation: int = 1

    @property
    def micro_batches(self) -> int:
        """M: the micro-batches of one optimizer step (MAX processes x the script's accumulation)."""
        return self.max_processes * self.accumulation

    @property
    def most(self) -> int:
        """The micro-batches of a full step the busiest process takes."""
        return -(-self.micro_batches // self.processes)

    @property
    def divisor(self) -> float:
        """What each micro-batch's loss is divided by: M / P (the accumulation, when P divides M)."""
        return self.micro_batches / self.processes

    @property
    def even(self) -> bool:
        """Every process takes as many micro-batches of a full step (P divides M)."""
        return self.micro_batches % self.processes == 0

    def owner(self, j: int) -> int:
        """The process that takes micro-batch `j` of a step."""
        return j % self.processes

    def own(self, in_step: int | None = None, rank: int | None = None) -> int:
        """Micro-batches of a step of `in_step` (default: a full step) that `rank` (default: this one) takes."""
        count = self.micro_batches if in_step is None else in_step
        rank = self.rank if rank is None else rank
        return max(0, -(-(count - rank) // self.processes))

    def own_before(self, micro_batch: int) -> int:
        """This process's micro-batches among the first `micro_batch` of a pass."""
        steps, rest = divmod(micro_batch, self.micro_batches)
        return steps * self.own() + self.own(rest)

    def at(self, index: int, total: int | None) -> MicroBatch:
        """This process's micro-batch number `index` of a pass of `total` micro-batches (None: unknown; then no step
        is known to be short).

        Example:
            >>> layout = ElasticLayout(max_processes=2, processes=1, rank=0, accumulation=3)
            >>> [layout.at(i, total=8).ends_step for i in range(8)]
            [False, False, False, False, False, True, False, True]
        """
        per_step = self.own()
        step = index // per_step
        in_step = self.micro_batches
        if total is not None:
            in_step = min(self.micro_batches, total - step * self.micro_batches)
        mine = self.own(in_step)
        ends = index - step * per_step == mine - 1
        return MicroBatch(step, ends, -(-in_step // self.processes) - mine)

    def step_start(self, done: int, total: int | None, stepped: bool) -> int:
        """The pass's micro-batch at which the step under way began, after this process handed out `done` of its
        own micro-batches (`stepped`: the optimizer has stepped since the last one): where a checkpoint resumes.

        Example:
            >>> layout = ElasticLayout(max_processes=2, processes=1, rank=0, accumulation=1)
            >>> layout.step_start(3, total=8, stepped=False), layout.step_start(4, total=8, stepped=True)
            (2, 4)
        """
        if done == 0:
            return 0
        last = self.at(done - 1, total)
        start = last.step * self.micro_batches
        if last.ends_step and stepped:
            start = min(start + self.micro_batches, total) if total is not None else start + self.micro_batches
        return start
