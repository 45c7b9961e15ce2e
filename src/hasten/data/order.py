"""The order in which an epoch visits a map-style dataset, as a pure function of (seed, epoch, position).

`SampleOrder` replaces the DataLoader's sampler in `prepare`. It has three kinds:

- ``sequential``: position i is index i (a DataLoader without shuffle).
- ``torch``: the DataLoader was given a ``generator``. Epoch e yields exactly
  what the *unprepared* DataLoader yields on its e-th pass (torch draws one
  base seed per pass, then ``randperm`` from that generator): a plain loop and
  a hasten loop can be compared sample by sample. Like torch, this
  materialises one permutation per epoch (8 bytes per sample).
- ``keyed``: shuffle without a generator. A keyed Feistel bijection of
  ``[0, n)`` (cycle-walking on the next power of four): any position is
  computed on its own, in O(1) memory, so a loader over 1e9 samples starts at
  once and a resume at batch k computes nothing for the k skipped batches.

Every kind supports `seek(position)` (the next pass starts there) and
random access with `indices(start, stop)`; the state needed to resume is the
seed (or generator state), the epoch and the position, see `state_dict`.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

__all__ = ["SampleOrder", "keyed_permutation"]

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
    """Dataset indices of one epoch; which epoch and where to start are state (see module doc).

    Example:
        >>> order = SampleOrder(6, kind="keyed", seed=0)
        >>> first = list(order); order.set_epoch(1)
        >>> sorted(first) == sorted(order) == list(range(6))
        True
        >>> order.set_epoch(0); order.seek(4); list(order) == first[4:]
        True
    """

    KINDS = ("sequential", "torch", "keyed")

    def __init__(
        self,
        num_items: int,
        kind: str = "sequential",
        seed: int = 0,
        generator_state: torch.Tensor | None = None,
        replacement: bool = False,
        num_samples: int | None = None,
    ) -> None:
        if kind not in self.KINDS:
            raise ValueError(f"SampleOrder kind must be one of {self.KINDS}, got {kind!r}.")
        if kind == "torch" and generator_state is None:
            raise ValueError("SampleOrder(kind='torch') needs the generator_state of the DataLoader's generator.")
        self.num_items = int(num_items)
        self.kind = kind
        self.seed = int(seed)
        self.replacement = bool(replacement)
        self._num_samples = num_samples
        self.epoch = 0
        self._start = 0
        self._known_states: dict[int, torch.Tensor] = {}  # epoch -> generator state at its start (kind 'torch')
        if generator_state is not None:
            self._known_states[0] = generator_state.clone()
        self._materialised: tuple[int, torch.Tensor] | None = None  # (epoch, indices) for kind 'torch'

    # -- sizes and epochs -------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        return self.num_items if self._num_samples is None else self._num_samples

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def seek(self, position: int) -> None:
        """Make the next pass start at `position` (later passes start at 0 again)."""
        if not 0 <= position <= self.num_samples:
            raise ValueError(f"cannot start an epoch of {self.num_samples} samples at position {position}.")
        self._start = int(position)

    # -- the generator stream of an unprepared DataLoader (kind 'torch') --------------
    def epoch_start_state(self, epoch: int) -> torch.Tensor:
        """The DataLoader generator's state when pass `epoch` begins (before torch draws its base seed)."""
        if epoch in self._known_states:
            return self._known_states[epoch]
        known = max(e for e in self._known_states if e <= epoch)
        for e in range(known, epoch):
            self._draw_epoch(e)
        return self._known_states[epoch]

    def _draw_epoch(self, epoch: int) -> torch.Tensor:
        """Replay pass `epoch` of torch's DataLoader + RandomSampler on a private generator."""
        generator = torch.Generator()
        generator.set_state(self.epoch_start_state(epoch))
        torch.empty((), dtype=torch.int64).random_(generator=generator)  # the DataLoader's base seed
        n, total = self.num_items, self.num_samples
        if self.replacement:  # RandomSampler draws in chunks of 32
            parts = [torch.randint(high=n, size=(32,), dtype=torch.int64, generator=generator) for _ in range(total // 32)]
            parts.append(torch.randint(high=n, size=(total % 32,), dtype=torch.int64, generator=generator))
        else:
            parts = [torch.randperm(n, generator=generator) for _ in range(total // n)] if n else []
            parts.append(torch.randperm(n, generator=generator)[: total % n] if n else torch.empty(0, dtype=torch.int64))
        self._known_states[epoch + 1] = generator.get_state()
        if len(self._known_states) > 4:  # keep the first epoch and the latest few
            for old in sorted(self._known_states)[1:-3]:
                del self._known_states[old]
        indices = torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
        self._materialised = (epoch, indices)
        return indices

    def _torch_indices(self) -> torch.Tensor:
        if self._materialised is None or self._materialised[0] != self.epoch:
            return self._draw_epoch(self.epoch)
        return self._materialised[1]

    # -- positions -> indices ---------------------------------------------------------
    def indices(self, start: int, stop: int) -> list[int]:
        """The dataset indices at positions ``[start, stop)`` of the current epoch."""
        stop = min(stop, self.num_samples)
        if stop <= start:
            return []
        if self.kind == "sequential":
            return [p % self.num_items for p in range(start, stop)] if self.num_items else []
        if self.kind == "torch":
            return self._torch_indices()[start:stop].tolist()
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
        if self.kind == "torch":
            yield self._torch_indices()[start:].tolist()
            return
        if self.kind == "sequential" and self._num_samples is None:
            for chunk_start in range(start, self.num_items, _CHUNK):
                yield range(chunk_start, min(chunk_start + _CHUNK, self.num_items))
            return
        for chunk_start in range(start, self.num_samples, _CHUNK):
            yield self.indices(chunk_start, chunk_start + _CHUNK)

    # -- checkpoint state ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"kind": self.kind, "num_items": self.num_items, "num_samples": self.num_samples,
                                 "replacement": self.replacement, "seed": self.seed}
        if self.kind == "torch":
            state["generator_state"] = self.epoch_start_state(0)
        return state

    def check_state(self, state: dict[str, Any]) -> None:
        """Raise one clear error if `state` was saved for another dataset or shuffle (nothing is changed)."""
        mismatched = [k for k in ("kind", "num_items", "num_samples", "replacement") if state.get(k) != getattr(self, k)]
        if mismatched:
            details = ", ".join(f"{k} {state.get(k)!r} in the checkpoint vs {getattr(self, k)!r} now" for k in mismatched)
            raise ValueError(f"the data loader's sample order does not match the checkpoint ({details}); "
                             "resume with the same dataset and shuffle settings.")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_state(state)
        self.seed = int(state["seed"])
        if self.kind == "torch":
            self._known_states = {0: state["generator_state"].clone()}
            self._materialised = None

    def __repr__(self) -> str:
        return f"SampleOrder(kind={self.kind!r}, num_items={self.num_items}, epoch={self.epoch})"
