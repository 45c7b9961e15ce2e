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

__all__ = ["SeedableRandomSampler"]


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
