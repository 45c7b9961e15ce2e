"""`SeedableRandomSampler`: a RandomSampler whose shuffle is a function of (seed, epoch).

Example:
    >>> sampler = SeedableRandomSampler(range(4), data_seed=0)
    >>> list(sampler) == list(SeedableRandomSampler(range(4), data_seed=0))
    True
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch.utils.data import RandomSampler

from .order import SampleOrder

__all__ = ["SeedableRandomSampler", "SeedableSampleOrder"]


class SeedableRandomSampler(RandomSampler):
    """Shuffles with seed `data_seed + epoch` (default seed: torch's initial seed), so every process draws the same order.

    Each full pass advances the epoch; `set_epoch(e)` picks one. (A stock
    `RandomSampler` given to `prepare` is already replaced by hasten's own
    seeded, resumable order; use this class where a sampler object is needed.)

    Example:
        >>> sampler = SeedableRandomSampler(range(4), data_seed=1)
        >>> first, second = list(sampler), list(sampler)  # two epochs: two shuffles
        >>> sampler.set_epoch(0); list(sampler) == first
        True
    """

    def __init__(self, *args: Any, data_seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initial_seed = data_seed if data_seed is not None else torch.random.initial_seed()
        self.epoch = 0

    def __iter__(self) -> Iterator[int]:
        if self.generator is None:
            self.generator = torch.Generator()
        self.generator.manual_seed(self.initial_seed + self.epoch)
        yield from super().__iter__()
        self.set_epoch(self.epoch + 1)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose shuffle the next pass uses."""
        self.epoch = epoch


class SeedableSampleOrder(SampleOrder, SeedableRandomSampler):
    """The seekable order `prepare` puts in place of a RandomSampler under ``use_seedable_sampler=True``.

    It is a `SampleOrder` of kind ``seedable`` (pass e shuffles with
    ``initial_seed + e``) and, as under Accelerate, a `SeedableRandomSampler`
    for code that checks the sampler's type.

    Example:
        >>> order = SeedableSampleOrder(range(5), seed=3)
        >>> isinstance(order, SeedableRandomSampler), order.initial_seed, sorted(order) == list(range(5))
        (True, 3, True)
    """

    def __init__(self, data_source: Any, seed: int, generator: torch.Generator | None = None, replacement: bool = False,
                 num_samples: int | None = None) -> None:
        SampleOrder.__init__(self, len(data_source), kind="seedable", seed=seed, generator=generator,
                             replacement=replacement, num_samples=num_samples)
        self.data_source = data_source

    @property
    def initial_seed(self) -> int:  # type: ignore[override]
        return self.seed

    @initial_seed.setter
    def initial_seed(self, seed: int) -> None:
        self.seed = int(seed)

    __iter__ = SampleOrder.__iter__
    __len__ = SampleOrder.__len__
    set_epoch = SampleOrder.set_epoch
