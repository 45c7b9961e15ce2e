"""The order in which one pass of a DataLoader visits a map-style dataset.

`SampleOrder` replaces a stock sampler in `prepare`. By default it draws
exactly what Accelerate's prepared loader draws, from the same random number
generators at the same moments, so the same seed gives every process the same
samples in the same order as under Accelerate (and as the plain torch
DataLoader on one process). Its kinds:

- ``sequential``: position i is index i (a DataLoader without shuffle).
- ``global``: torch's `RandomSampler` without a generator on one process: at
  the start of each pass one seed is drawn from torch's global RNG, and the
  pass is ``randperm`` from a generator seeded with it.
- ``torch``: a `RandomSampler` that draws from a generator object (the user's,
  or, on several processes, the one `prepare` seeds from the global RNG and
  makes equal on every process, as Accelerate does): each pass draws its
  permutation from that generator, which advances from pass to pass.
- ``seedable``: ``use_seedable_sampler=True``: pass e is ``randperm`` from a
  generator seeded with ``seed + e`` (the seed: ``data_seed``, else torch's
  initial seed).
- ``keyed``: hasten's opt-in (``DataLoaderConfiguration(keyed_shuffle=True)``),
  also used for a dataset too large for a permutation in memory: a keyed
  Feistel bijection of ``[0, n)`` (cycle-walking on the next power of four).
  Any position is computed on its own, in O(1) memory, so a loader over 1e9
  samples starts at once. Its order differs from Accelerate's.

The random kinds but ``keyed`` hold one permutation per pass (8 bytes per
sample, where torch's sampler holds a Python list).

Every kind supports `seek(position)` (the next pass starts there) and random
access with `indices(start, stop)`. A checkpoint holds what replays the
current pass exactly (the generator's state before the pass drew, or the
seed it drew) and the generator's state now, see `state_dict`; a pass that
continues a checkpointed one (`begin_pass(continuing=True)`) draws nothing.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

__all__ = ["SampleOrder", "keyed_permutation", "PERMUTATION_LIMIT"]

# A stock RandomSampler's shuffle: one process draws it as 'global', several as 'torch' (checkpoints carry it over).
_CARRIED = {"global", "torch"}
# Above this many samples a shuffled loader uses the keyed order (a permutation would take > 1 GiB); logged once.
PERMUTATION_LIMIT = 1 << 27
_MASK64 = (1 << 64) - 1
_CHUNK = 4096  # positions computed per vectorised step while iterating
_MUL1, _MUL2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_ROUNDS = 4


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise on uint64 (a strong 64-bit hash)."""
    with np.errstate(over="ignore"):
        values = values ^ (values >> np.uint64(30))
        values = values * _MUL1
        values = values ^ (values >> np.uint64(27))
        values = values * _MUL2
        return values ^ (values >> np.uint64(31))


def _round_keys(seed: int, epoch: int, cycle: int) -> list[np.uint64]:
    base = seed * 0x9E3779B97F4A7C15 + epoch * 0xD1B54A32D192ED03 + cycle * 0x8CB92BA72F3D8DD7
    raw = np.array([(base + i) & _MASK64 for i in range(_ROUNDS)], dtype=np.uint64)
    return [np.uint64(k) for k in _mix(raw)]


def keyed_permutation(positions: np.ndarray, n: int, seed: int, epoch: int = 0, cycle: int = 0) -> np.ndarray:
    """Map positions in ``[0, n)`` to indices in ``[0, n)`` by a keyed bijection (the same keys give the same map).

    Example:
        >>> import numpy as np
        >>> order = keyed_permutation(np.arange(10, dtype=np.uint64), 10, seed=1)
        >>> sorted(order.tolist()) == list(range(10))
        True
    """
    if n <= 1:
        return np.zeros(len(positions), dtype=np.uint64)
    bits = max(2, (n - 1).bit_length())
    bits += bits % 2
    half, mask = np.uint64(bits // 2), np.uint64((1 << (bits // 2)) - 1)
    keys = _round_keys(seed, epoch, cycle)
    limit = np.uint64(n)

    def encrypt(x: np.ndarray) -> np.ndarray:
        left, right = x >> half, x & mask
        for key in keys:
            left, right = right, left ^ (_mix(right ^ key) & mask)
        return (left << half) | right

    values = encrypt(positions.astype(np.uint64, copy=True))
    outside = values >= limit
    while outside.any():  # cycle-walking: the domain is < 4n, so few rounds are needed
        values[outside] = encrypt(values[outside])
        outside = values >= limit
    return values


class SampleOrder(Sampler[int]):
    """Dataset indices of one pass; the pass, the epoch and where to start are state (see module doc).

    Example:
        >>> order = SampleOrder(6, kind="keyed", seed=0)
        >>> first = list(order); order.set_epoch(1)
        >>> sorted(first) == sorted(order) == list(range(6))
        True
        >>> order.set_epoch(0); order.seek(4); list(order) == first[4:]
        True
        >>> _ = torch.manual_seed(0); ours = list(SampleOrder(5, kind="global"))
        >>> _ = torch.manual_seed(0); ours == list(torch.utils.data.RandomSampler(range(5)))
        True
    """

    KINDS = ("sequential", "global", "torch", "seedable", "keyed")

    def __init__(
        self,
        num_items: int,
        kind: str = "sequential",
        seed: int = 0,
        generator: torch.Generator | None = None,
        replacement: bool = False,
        num_samples: int | None = None,
    ) -> None:
        if kind not in self.KINDS:
            raise ValueError(f"SampleOrder kind must be one of {self.KINDS}, got {kind!r}.")
        if kind == "torch" and generator is None:
            raise ValueError("SampleOrder(kind='torch') needs the generator the sampler draws from.")
        self.num_items = int(num_items)
        self.kind = kind
        self.seed = int(seed)
        self.generator = generator
        self.replacement = bool(replacement)
        self._num_samples = num_samples
        self.epoch = 0
        self._start = 0
        self._permutation: torch.Tensor | None = None  # the current pass's indices (random kinds but keyed)
        self._pass_seed: int | None = None  # kind 'global': the seed the current pass drew
        self._pass_state: torch.Tensor | None = None  # kind 'torch': the generator's state before the pass drew

    # -- sizes, epochs, passes ---------------------------------------------------------
    @property
    def num_samples(self) -> int:
        return self.num_items if self._num_samples is None else self._num_samples

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        if int(epoch) != self.epoch and self.kind in ("seedable", "keyed"):
            self._permutation = None
        self.epoch = int(epoch)

    def seek(self, position: int) -> None:
        """Make the next pass start at `position` (later passes start at 0 again)."""
        if not 0 <= position <= self.num_samples:
            raise ValueError(f"cannot start an epoch of {self.num_samples} samples at position {position}.")
        self._start = int(position)

    def begin_pass(self, continuing: bool = False) -> None:
        """A pass starts: a new one draws afresh when its indices are first needed; a continuing one replays."""
        if continuing:
            return
        self._permutation = None
        self._pass_seed = None
        self._pass_state = None

    @property
    def drawn(self) -> bool:
        """Has the current pass made its draws (a checkpoint then holds what replays them)?"""
        if self.kind == "global":
            return self._pass_seed is not None
        if self.kind == "torch":
            return self._pass_state is not None or self._pass_seed is not None
        return False

    # -- the permutation of the current pass (drawn as torch's RandomSampler draws it) ---------
    def _draw(self, generator: torch.Generator) -> torch.Tensor:
        n, total = self.num_items, self.num_samples
        if self.replacement:  # RandomSampler draws in chunks of 32
            parts = [torch.randint(high=n, size=(32,), dtype=torch.int64, generator=generator) for _ in range(total // 32)]
            parts.append(torch.randint(high=n, size=(total % 32,), dtype=torch.int64, generator=generator))
        elif n:
            parts = [torch.randperm(n, generator=generator) for _ in range(total // n)]
            parts.append(torch.randperm(n, generator=generator)[: total % n])
        else:
            parts = []
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)

    def _pass_indices(self) -> torch.Tensor:
        if self._permutation is not None:
            return self._permutation
        if self.kind == "global":
            if self._pass_seed is None:  # what RandomSampler draws from the global RNG at the start of a pass
                self._pass_seed = int(torch.empty((), dtype=torch.int64).random_().item())
            generator = torch.Generator()
            generator.manual_seed(self._pass_seed)
        elif self.kind == "torch" and self._pass_seed is not None:
            # a pass carried over from a one-process checkpoint ('global'): replay the seed that pass drew
            generator = torch.Generator()
            generator.manual_seed(self._pass_seed)
        elif self.kind == "torch":
            generator = self.generator  # type: ignore[assignment]
            if self._pass_state is None:
                self._pass_state = generator.get_state()
            else:  # replaying a checkpointed pass: the generator ends where it was when that pass drew
                generator.set_state(self._pass_state)
        else:  # seedable
            if self.generator is None:
                self.generator = torch.Generator()
            generator = self.generator
            generator.manual_seed(self.seed + self.epoch)
        self._permutation = self._draw(generator)
        return self._permutation

    # -- positions -> indices ---------------------------------------------------------
    def indices(self, start: int, stop: int) -> list[int]:
        """The dataset indices at positions ``[start, stop)`` of the current pass."""
        stop = min(stop, self.num_samples)
        if stop <= start:
            return []
        if self.kind == "sequential":
            return [p % self.num_items for p in range(start, stop)] if self.num_items else []
        if self.kind != "keyed":
            return self._pass_indices()[start:stop].tolist()
        positions = np.arange(start, stop, dtype=np.uint64)
        n = self.num_items
        if self.replacement:
            keys = _mix(positions ^ np.uint64(_round_keys(self.seed, self.epoch, 0)[0]))
            return (keys % np.uint64(n)).tolist()
        out = np.empty(len(positions), dtype=np.uint64)
        cycles = positions // np.uint64(n)
        for cycle in np.unique(cycles).tolist():  # num_samples > n: each pass over n is its own permutation
            chosen = cycles == np.uint64(cycle)
            out[chosen] = keyed_permutation(positions[chosen] % np.uint64(n), n, self.seed, self.epoch, int(cycle))
        return out.tolist()

    def __iter__(self) -> Iterator[int]:
        for chunk in self.index_chunks():
            yield from chunk

    def index_chunks(self) -> Iterator[Sequence[int]]:
        """One pass's indices in consecutive runs (what iterating yields one by one), from where a seek left it."""
        start, self._start = self._start, 0
        if self.kind in ("global", "torch", "seedable"):
            yield self._pass_indices()[start:].tolist()
            return
        if self.kind == "sequential" and self._num_samples is None:
            for chunk_start in range(start, self.num_items, _CHUNK):
                yield range(chunk_start, min(chunk_start + _CHUNK, self.num_items))
            return
        for chunk_start in range(start, self.num_samples, _CHUNK):
            yield self.indices(chunk_start, chunk_start + _CHUNK)

    # -- checkpoint state ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What replays the current pass and continues the generator's stream (tensors and plain values only)."""
        state: dict[str, Any] = {"kind": self.kind, "num_items": self.num_items, "num_samples": self.num_samples,
                                 "replacement": self.replacement, "seed": self.seed, "pass_seed": self._pass_seed}
        if self.kind == "torch":
            state["generator_state"] = self.generator.get_state()  # type: ignore[union-attr]
            state["pass_state"] = self._pass_state
        return state

    def check_state(self, state: dict[str, Any]) -> None:
        """Raise one clear error if `state` was saved for another dataset or shuffle (nothing is changed).

        A stock shuffle saved by another number of processes is the same shuffle: one process draws it as
        'global', several as 'torch' (from the generator `prepare` seeds); `load_state_dict` carries it over.
        """
        mismatched = [k for k in ("kind", "num_items", "num_samples", "replacement") if state.get(k) != getattr(self, k)
                      and not (k == "kind" and {state.get(k), self.kind} <= _CARRIED)]
        if mismatched:
            details = ", ".join(f"{k} {state.get(k)!r} in the checkpoint vs {getattr(self, k)!r} now" for k in mismatched)
            raise ValueError(f"the data loader's sample order does not match the checkpoint ({details}); "
                             "resume with the same dataset and shuffle settings.")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the saved order: replay its current pass, then go on drawing as it would have.

        From several processes to one ('torch' saved, 'global' here) the order
        takes the saved generator along, so every later pass is the one the
        several processes would have drawn. From one process to several, the
        interrupted pass is replayed from its seed and later passes are drawn
        from this run's generator (the same on every process).

        Example:
            >>> saved = SampleOrder(6, kind="torch", generator=torch.Generator().manual_seed(0))
            >>> first = list(saved); state = saved.state_dict()
            >>> alone = SampleOrder(6, kind="global"); alone.load_state_dict(state); alone.begin_pass(continuing=True)
            >>> list(alone) == first, alone.kind
            (True, 'torch')
        """
        self.check_state(state)
        if state["kind"] == "torch" and self.kind == "global":
            self.kind, self.generator = "torch", torch.Generator()
        self.seed = int(state["seed"])
        self._permutation = None
        self._pass_seed = state.get("pass_seed")
        self._pass_state = None
        if self.kind == "torch" and "generator_state" in state:
            self.generator.set_state(state["generator_state"])  # type: ignore[union-attr]
            pass_state = state.get("pass_state")
            self._pass_state = None if pass_state is None else pass_state.clone()

    def __repr__(self) -> str:
        return f"SampleOrder(kind={self.kind!r}, num_items={self.num_items}, epoch={self.epoch})"
