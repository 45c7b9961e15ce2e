"""hasten's prepared loaders against Accelerate's own `prepare_data_loader`, in one process, over many layouts.

Each simulated rank is prepared by both libraries from the same seed; over
two epochs they must yield the same batches, report the same `len()`,
`total_batch_size` and `remainder`, and leave torch's global RNG in the same
state (the same random numbers drawn at the same times). Ranks are simulated
by passing `num_processes` / `process_index` explicitly, as both libraries
allow; the real multi-process runs are in tests/parity/.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, RandomSampler, SequentialSampler

from hasten.data import prepare_data_loader as hasten_prepare
from hasten.runtime.gradient_state import GradientState

accelerate_data_loader = pytest.importorskip("accelerate.data_loader")


class Indexed(Dataset):
    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index):
        return torch.tensor(index)


class Stream(IterableDataset):
    def __init__(self, size: int, sized: bool = True) -> None:
        self.size, self.sized = size, sized

    def __iter__(self):
        return iter(torch.tensor(i) for i in range(self.size))

    def __len__(self) -> int:
        if not self.sized:
            raise TypeError("unsized")
        return self.size


class Buckets(BatchSampler):
    """A custom batch sampler with batches of varying size."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.batch_size = None
        self.drop_last = False

    def __iter__(self):
        start, width = 0, 1
        while start < self.size:
            yield list(range(start, min(self.size, start + width)))
            start, width = start + width, width % 3 + 1

    def __len__(self) -> int:
        return len(list(iter(self)))


def _flatten(batch):
    if isinstance(batch, torch.Tensor):
        return batch.tolist()
    return [_flatten(b) for b in batch]


def _make(kind: str, size: int, batch_size: int, drop_last: bool, seed: int) -> DataLoader:
    dataset = Indexed(size)
    if kind == "sequential":
        return DataLoader(dataset, batch_size=batch_size, drop_last=drop_last)
    if kind == "shuffle":
        return DataLoader(dataset, batch_size=batch_size, drop_last=drop_last, shuffle=True)
    if kind == "generator":
        return DataLoader(dataset, batch_size=batch_size, drop_last=drop_last, shuffle=True,
                          generator=torch.Generator().manual_seed(seed + 100))
    if kind == "replacement":
        return DataLoader(dataset, batch_size=batch_size, drop_last=drop_last,
                          sampler=RandomSampler(dataset, replacement=True, num_samples=size + 3))
    if kind == "batch_sampler_as_sampler":
        return DataLoader(dataset, batch_size=None,
                          sampler=BatchSampler(RandomSampler(dataset), batch_size=batch_size, drop_last=drop_last))
    if kind == "batch_sampler_as_sampler_bs1":
        return DataLoader(dataset, sampler=BatchSampler(SequentialSampler(dataset), batch_size, drop_last))
    if kind == "buckets":
        return DataLoader(dataset, batch_sampler=Buckets(size))
    raise ValueError(kind)


def _run(library: str, loader_factory, rank: int, world: int, seed: int, epochs: int = 2, **options):
    torch.manual_seed(seed)
    loader = loader_factory()
    if library == "torch":  # the unprepared loader
        prepared = loader
        prepared.remainder = prepared.total_batch_size = None
    elif library == "hasten":
        GradientState._reset_state()
        prepared = hasten_prepare(loader, num_processes=world, process_index=rank, **options)
    else:
        prepared = accelerate_data_loader.prepare_data_loader(loader, num_processes=world, process_index=rank, **options)
    passes, remainders = [], []
    for _ in range(epochs):
        passes.append([_flatten(b) for b in prepared])
        remainders.append(prepared.remainder)
    try:
        length = len(prepared)
    except TypeError:
        length = None
    try:
        total = prepared.total_batch_size
    except (AttributeError, TypeError):  # no batch sampler, or batches of no fixed size
        total = None
    return {"passes": passes, "len": length, "total_batch_size": total, "remainder": remainders,
            "rng": torch.get_rng_state().tolist()}


def _compare(loader_factory, world: int, seed: int = 0, peer: str = "accelerate", **options) -> None:
    for rank in range(world):
        try:
            theirs = _run("accelerate", loader_factory, rank, world, seed, **options)
        except ValueError:  # a layout Accelerate refuses: hasten refuses it too
            with pytest.raises(ValueError):
                _run("hasten", loader_factory, rank, world, seed, **options)
            return
        except TypeError:  # Accelerate breaks (e.g. a BatchSampler as sampler with batch_size=None on one process)
            if peer != "torch":
                _run("hasten", loader_factory, rank, world, seed, **options)  # hasten must simply work
                return
        ours = _run("hasten", loader_factory, rank, world, seed, **options)
        if peer == "torch":  # one process, where hasten's loader must be the plain DataLoader's
            theirs = _run("torch", loader_factory, 0, 1, seed)
            assert ours["passes"] == theirs["passes"] and ours["rng"] == theirs["rng"]
            continue
        for key in ("passes", "len", "total_batch_size", "remainder"):
            assert ours[key] == theirs[key], f"rank {rank}/{world}, {key}: hasten {ours[key]} != accelerate {theirs[key]}"
        assert ours["rng"] == theirs["rng"], f"rank {rank}/{world}: torch's global RNG ends in another state"


KINDS = ["sequential", "shuffle", "generator", "replacement", "batch_sampler_as_sampler",
         "batch_sampler_as_sampler_bs1", "buckets"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("world", [1, 2, 3])
def test_map_style_layouts_match_accelerate(kind, world):
    for size, batch_size, drop_last, split, even in itertools.product(
        [1, 5, 16, 17], [1, 4], [False, True], [False, True], [True, False]
    ):
        if kind == "buckets" and (split or drop_last):
            continue  # batches of no fixed size cannot be split; the custom sampler has no drop_last
        # On one process Accelerate double-batches a BatchSampler given as sampler (batch_size=1) or breaks
        # (batch_size=None); hasten keeps the plain DataLoader's batches there, as Accelerate does on N processes.
        peer = "torch" if world == 1 and kind.startswith("batch_sampler_as_sampler") else "accelerate"
        _compare(lambda: _make(kind, size, batch_size, drop_last, seed=size), world, seed=size, peer=peer,
                 split_batches=split, even_batches=even)


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("data_seed", [None, 1234])
@pytest.mark.parametrize("kind", ["shuffle", "generator", "batch_sampler_as_sampler"])
def test_seedable_sampler_matches_accelerate(world, data_seed, kind):
    for size, batch_size in [(5, 2), (17, 4)]:
        _compare(lambda: _make(kind, size, batch_size, False, seed=size), world, seed=size + 7,
                 use_seedable_sampler=True, data_seed=data_seed)


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("sized", [True, False])
def test_iterable_layouts_match_accelerate(world, sized):
    for size, batch_size, drop_last, split in itertools.product([1, 5, 16, 17], [1, 4, 6], [False, True], [False, True]):
        _compare(lambda: DataLoader(Stream(size, sized), batch_size=batch_size, drop_last=drop_last), world,
                 split_batches=split)
