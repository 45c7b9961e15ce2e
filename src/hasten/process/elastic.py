"""What a world size means in an elastic run: the one place that says it.

An elastic run (`hasten launch --num_machines MIN:MAX`) may train on any
number of machines between MIN and MAX; torch's elastic agent re-forms the
group when machines leave or join. The run's *recipe* is the one at MAX
machines and stays the same at every size:

- each process keeps its per-process batch (memory does not change);
- gradient accumulation rises so that the global batch holds:
  ``accumulation_at(size) = accumulation * max_processes / size``;
- the learning-rate schedule advances by optimizer step as at MAX: the
  prepared scheduler steps ``max_processes`` times per optimizer step
  (Accelerate's rule at MAX), whatever the group's size now.

A size whose accumulation would not be a whole number would train another
recipe; `check_sizes` refuses it, for every size the run may meet, before
the first step (one sentence naming the sizes and the fix).

Example:
    >>> spec = ElasticSizes(min_processes=1, max_processes=2)
    >>> spec.accumulation_at(1, accumulation=2), spec.accumulation_at(2, accumulation=2)
    (4, 2)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ElasticSizes", "parse_machines", "ElasticSizeError"]


class ElasticSizeError(ValueError):
    """A machine range or a group size an elastic run cannot train its recipe on (one sentence with the fix)."""


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
    """The process counts an elastic run may train on, and what each means for accumulation.

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

    def accumulation_at(self, size: int, accumulation: int = 1) -> int:
        """Gradient accumulation at `size` processes that keeps the global batch of `max_processes` x `accumulation`.

        Example:
            >>> ElasticSizes(1, 3).accumulation_at(2)
            Traceback (most recent call last):
            ...
            hasten.process.elastic.ElasticSizeError: an elastic run's global batch is its per-process batch x 3 processes x 1 accumulation step(s), which 2 processes cannot hold (3 is not a multiple of 2); choose gradient_accumulation_steps or a machine range whose every size divides max processes x accumulation (here sizes 2 do not).
        """
        total = self.max_processes * accumulation
        if size < 1 or total % size:
            self.check(accumulation, [size])
        return total // size

    def check(self, accumulation: int = 1, sizes: list[int] | None = None) -> None:
        """Refuse, in one sentence, an accumulation that some size of the run cannot keep as a whole number.

        Example:
            >>> ElasticSizes(1, 4, 1).check(accumulation=2)  # 8 = 1 x 8 = 2 x 4 = 4 x 2: every size but 3
            Traceback (most recent call last):
            ...
            hasten.process.elastic.ElasticSizeError: an elastic run's global batch is its per-process batch x 4 processes x 2 accumulation step(s), which 3 processes cannot hold (8 is not a multiple of 3); choose gradient_accumulation_steps or a machine range whose every size divides max processes x accumulation (here sizes 3 do not).
        """
        total = self.max_processes * accumulation
        bad = [size for size in (self.sizes() if sizes is None else sizes) if size < 1 or total % size]
        if not bad:
            return
        raise ElasticSizeError(
            f"an elastic run's global batch is its per-process batch x {self.max_processes} processes x {accumulation} "
            f"accumulation step(s), which {bad[0]} processes cannot hold ({total} is not a multiple of {bad[0]}); "
            f"choose gradient_accumulation_steps or a machine range whose every size divides max processes x "
            f"accumulation (here sizes {', '.join(map(str, bad))} do not).")
