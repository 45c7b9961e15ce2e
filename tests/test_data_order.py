"""The data position as state: the same order as an unprepared loader, O(1) shuffles, resume without drawing."""

from __future__ import annotations

import resource
import time

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset

from hasten.data import SampleOrder, ShardedBatchSampler, keyed_permutation, prepare_data_loader, skip_first_batches

CPU = torch.device("cpu")


def flat(loader) -> list[int]:
    return [int(i) for batch in loader for i in batch]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4099])
def test_keyed_permutation_is_a_bijection(n):
    order = keyed_permutation(np.arange(n, dtype=np.uint64), n, seed=11, epoch=3)
    assert sorted(order.tolist()) == list(range(n))


def test_prepared_loader_yields_the_unprepared_order_of_its_generator():
    # The order a plain loop sees (torch draws a base seed, then randperm, from the loader's generator).
    def plain():
        return DataLoader(list(range(23)), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3))

    unprepared, prepared = plain(), prepare_data_loader(plain(), CPU)
    for epoch in range(3):
        assert [b.tolist() for b in prepared] == [b.tolist() for b in unprepared], f"epoch {epoch}"
    # As under Accelerate, set_epoch does not rewind a generator-driven shuffle: the generator goes on.
    prepared.set_epoch(1)
    assert [b.tolist() for b in prepared] == [b.tolist() for b in unprepared]


def test_two_processes_share_the_one_process_global_order():
    order = SampleOrder(37, kind="keyed", seed=9)
    single = list(BatchSampler(SampleOrder(37, kind="keyed", seed=9), 4, False))
    ranks = [list(ShardedBatchSampler(BatchSampler(order, 2, False), 2, r)) for r in range(2)]
    interleaved = [i for pair in zip(*ranks) for batch in pair for i in batch]
    assert interleaved[:37] == [i for b in single for i in b]


def test_no_generator_shuffle_is_reproducible_from_the_global_seed():
    def epochs(seed):
        torch.manual_seed(seed)
        loader = prepare_data_loader(DataLoader(list(range(20)), batch_size=5, shuffle=True), CPU)
        return [flat(loader) for _ in range(2)]

    first = epochs(0)
    assert first == epochs(0) and first[0] != first[1] and sorted(first[0]) == list(range(20))


class Huge(Dataset):
    """1e9 samples computed on demand; records what was read."""

    def __init__(self, n=10**9):
        self.n, self.read = n, []

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        self.read.append(index)
        return index


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_a_billion_sample_loader_starts_at_once_with_flat_memory_and_resumes_without_drawing():
    data = Huge()
    rss_before = _rss_mib()
    started = time.perf_counter()
    loader = prepare_data_loader(DataLoader(data, batch_size=64, shuffle=True), CPU)
    first = next(iter(loader))
    took = time.perf_counter() - started
    assert took < 0.5, f"first batch after {took:.2f}s"
    assert _rss_mib() - rss_before < 50  # torch's RandomSampler would hold a randperm(1e9): 8 GB
    assert len(set(first.tolist())) == 64

    k = 10**7  # resume 10 million batches into the epoch
    state = loader.state_dict() | {"yielded": k}
    data.read.clear()
    started = time.perf_counter()
    loader.load_state_dict(state)
    batch = next(iter(loader))
    assert time.perf_counter() - started < 0.5
    assert batch.tolist() == loader.order.indices(k * 64, (k + 1) * 64)
    assert data.read[:64] == batch.tolist() and len(data.read) == 128, "only the resumed batch (and the look-ahead) is read"


def test_skip_first_batches_of_a_prepared_loader_reads_nothing_skipped_and_keeps_counting():
    data = Huge(40)
    torch.manual_seed(0)
    full = [b.tolist() for b in prepare_data_loader(DataLoader(data, batch_size=4, shuffle=True), CPU)]
    torch.manual_seed(0)  # the same draws again: the view's pass shuffles as the full pass did
    loader = prepare_data_loader(DataLoader(data, batch_size=4, shuffle=True), CPU)
    data.read.clear()
    view = skip_first_batches(loader, 7)
    assert len(view) == 3 and [b.tolist() for b in view] == full[7:]
    assert sorted(data.read) == sorted(i for b in full[7:] for i in b)
    assert loader.epoch == 1  # the view's pass finished the epoch of the loader it came from


def test_sequential_loader_seeks_too():
    data = Huge(10)
    loader = prepare_data_loader(DataLoader(data, batch_size=3), CPU)
    loader.load_state_dict({"epoch": 0, "yielded": 2, "global_batch_size": 3, "order": loader.order.state_dict()})
    data.read.clear()
    assert [b.tolist() for b in loader] == [[6, 7, 8], [9]] and data.read == [6, 7, 8, 9]


def test_a_different_dataset_is_refused():
    loader = prepare_data_loader(DataLoader(list(range(10)), batch_size=2, shuffle=True), CPU)
    state = loader.state_dict()
    other = prepare_data_loader(DataLoader(list(range(12)), batch_size=2, shuffle=True), CPU)
    with pytest.raises(ValueError, match="num_items 10 in the checkpoint vs 12 now"):
        other.order.check_state(state["order"])
