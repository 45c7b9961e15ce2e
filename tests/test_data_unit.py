"""Sharding logic, simulated for every rank in one process (no process group needed)."""

import itertools

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler

from hasten.data import (
    SampleOrder,
    IterableDatasetShard,
    ShardedBatchSampler,
    prepare_data_loader,
    skip_first_batches,
)
from hasten.runtime.gradient_state import GradientState


# split_batches needs the batch size to be a multiple of the world size
CASES = [
    (n, b, w, split)
    for n, b, w, split in itertools.product([1, 7, 16, 17, 101, 128], [1, 4, 8], [2, 3, 4], [False, True])
    if not (split and b % w)
]


def shards(n_samples, batch_size, world, split=False, even=True, drop_last=False):
    inner = BatchSampler(SequentialSampler(range(n_samples)), batch_size, drop_last)
    samplers = [ShardedBatchSampler(inner, world, r, split_batches=split, even_batches=even) for r in range(world)]
    return samplers, [list(s) for s in samplers]


@pytest.mark.parametrize("n_samples, batch_size, world, split", CASES)
def test_uneven_mode_sees_every_sample_exactly_once(n_samples, batch_size, world, split):
    samplers, per_rank = shards(n_samples, batch_size, world, split=split, even=False)
    seen = sorted(i for batches in per_rank for b in batches for i in b)
    assert seen == list(range(n_samples))
    for sampler, batches in zip(samplers, per_rank):
        # As in Accelerate, split batches count every inner batch, even one too short to reach every process.
        assert len(sampler) == (len(sampler.batch_sampler) if split else len(batches))


@pytest.mark.parametrize("n_samples, batch_size, world, split", CASES)
def test_even_mode_pads_by_wrapping_around(n_samples, batch_size, world, split):
    samplers, per_rank = shards(n_samples, batch_size, world, split=split, even=True)
    counts = {len(batches) for batches in per_rank}
    assert len(counts) == 1, "every rank must step equally often"
    for sampler, batches in zip(samplers, per_rank):
        assert len(sampler) == len(batches)
    # Global batches, in rank order, are the sequential stream padded with the epoch's first samples.
    stream = [i for step in zip(*per_rank) for b in step for i in b]
    assert stream[:n_samples] == list(range(n_samples))
    padding = stream[n_samples:]
    assert padding == list(itertools.islice(itertools.cycle(range(n_samples)), len(padding)))
    global_batch = batch_size if split else batch_size * world
    assert len(padding) < global_batch
    assert samplers[0].padded_remainder == n_samples % global_batch


def test_strided_assignment_matches_one_big_batch():
    # 2 ranks with batch 8: global step k holds exactly the samples of 1 rank with batch 16.
    _, per_rank = shards(64, 8, 2)
    big = list(BatchSampler(SequentialSampler(range(64)), 16, False))
    assert [sorted(a + b) for a, b in zip(*per_rank)] == big


def test_drop_last_drops_incomplete_global_batch():
    samplers, per_rank = shards(21, 4, 2, drop_last=True)
    assert [len(b) for b in per_rank] == [2, 2] and len(samplers[0]) == 2


def test_split_batches_needs_divisible_batch():
    inner = BatchSampler(SequentialSampler(range(10)), 5, False)
    with pytest.raises(ValueError, match=r"batch_size \(5\) to be a multiple of the number of processes \(2\)"):
        ShardedBatchSampler(inner, 2, 0, split_batches=True)


def test_epoch_seeded_sampler_agrees_and_reshuffles():
    a, b = SampleOrder(50, kind="keyed", seed=3), SampleOrder(50, kind="keyed", seed=3)
    epoch0 = list(a)
    assert epoch0 == list(b) and sorted(epoch0) == list(range(50)) and epoch0 != list(range(50))
    a.set_epoch(1)
    assert list(a) != epoch0 and sorted(a) == list(range(50))


class Stream(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


@pytest.mark.parametrize("drop_last", [False, True])
def test_iterable_shards_are_disjoint_and_cover(drop_last):
    per_rank = [list(IterableDatasetShard(Stream(23), 4, num_processes=2, process_index=r, drop_last=drop_last))
                for r in range(2)]
    if not drop_last:
        assert len(per_rank[0]) == len(per_rank[1]) == 12
        assert sorted(set(per_rank[0] + per_rank[1])) == list(range(23))
        assert per_rank[1][-1:] == [0]  # the one padding item wraps around to the start
    else:
        assert sorted(per_rank[0] + per_rank[1]) == list(range(16))


def test_prepared_loader_single_process_keeps_order_and_flags_the_end():
    state = GradientState()
    loader = prepare_data_loader(DataLoader(list(range(10)), batch_size=4), torch.device("cpu"), gradient_state=state)
    flags = []
    for batch in loader:
        flags.append((batch.tolist(), state.end_of_dataloader))
    assert flags == [([0, 1, 2, 3], False), ([4, 5, 6, 7], False), ([8, 9], True)]
    assert not state.in_dataloader  # popped at the end


def test_nested_loaders_keep_their_own_end_flag():
    state = GradientState()
    outer = prepare_data_loader(DataLoader(list(range(4)), batch_size=2), torch.device("cpu"), gradient_state=state)
    inner = prepare_data_loader(DataLoader(list(range(2)), batch_size=1), torch.device("cpu"), gradient_state=state)
    seen = []
    for _ in outer:
        for _ in inner:
            pass
        seen.append(state.end_of_dataloader)
    assert seen == [False, True]


def test_shuffled_loader_reshuffles_per_epoch_and_is_reproducible():
    def epochs(seed):
        torch.manual_seed(seed)
        loader = prepare_data_loader(DataLoader(list(range(20)), batch_size=5, shuffle=True), torch.device("cpu"))
        return [[i for b in loader for i in b.tolist()] for _ in range(2)]

    first, second = epochs(0)
    assert sorted(first) == sorted(second) == list(range(20)) and first != second
    assert epochs(0) == [first, second]


def test_set_epoch_selects_the_seedable_shuffle():
    torch.manual_seed(0)
    loader = prepare_data_loader(DataLoader(list(range(20)), batch_size=5, shuffle=True), torch.device("cpu"),
                                 use_seedable_sampler=True)
    epoch0 = [i for b in loader for i in b.tolist()]
    assert [i for b in loader for i in b.tolist()] != epoch0
    loader.set_epoch(0)
    assert [i for b in loader for i in b.tolist()] == epoch0


def test_skip_first_batches_does_not_load_skipped_samples():
    loaded = []

    class Recording(torch.utils.data.Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            loaded.append(i)
            return i

    loader = skip_first_batches(DataLoader(Recording(), batch_size=3), 2)
    assert [b.tolist() for b in loader] == [[6, 7, 8], [9]]
    assert loaded == [6, 7, 8, 9] and len(loader) == 2


def test_already_prepared_loader_is_refused():
    loader = prepare_data_loader(DataLoader(list(range(4)), batch_size=2), torch.device("cpu"))
    with pytest.raises(ValueError, match="already prepared"):
        prepare_data_loader(loader, torch.device("cpu"))


@pytest.mark.parametrize("options, world, kind", [
    ({}, 1, "global"), ({}, 2, "torch"), ({"use_seedable_sampler": True}, 2, "seedable"),
    ({"keyed_shuffle": True}, 2, "keyed"),
])
def test_random_sampler_is_replaced_by_a_seekable_order(options, world, kind):
    loader = prepare_data_loader(DataLoader(list(range(8)), batch_size=2, shuffle=True), torch.device("cpu"),
                                 num_processes=world, process_index=0, **options)
    order = loader.batch_sampler.batch_sampler.sampler if world > 1 else loader.batch_sampler.sampler
    assert isinstance(order, SampleOrder) and order.kind == kind
    # (the seedable one is also a SeedableRandomSampler, as Accelerate's peer tests check)
    assert isinstance(order, RandomSampler) == (kind == "seedable")


def test_send_to_device_keeps_container_types():
    import dataclasses
    from collections import OrderedDict, UserDict, namedtuple

    from hasten.runtime.collectives import send_to_device

    @dataclasses.dataclass
    class Batch:
        x: torch.Tensor
        label: str

    Pair = namedtuple("Pair", "a b")

    class Encoding(UserDict):  # like transformers' BatchEncoding: a mapping with its own .to
        def to(self, device, non_blocking=False):
            return Encoding({k: v.to(device) for k, v in self.data.items()})

    batch = {"d": Batch(torch.ones(1), "cat"), "p": Pair(torch.zeros(1), [torch.ones(2)]),
             "o": OrderedDict(z=torch.ones(1)), "e": Encoding(ids=torch.ones(1)), "n": 3}
    moved = send_to_device(batch, "cpu")
    assert isinstance(moved["d"], Batch) and moved["d"].label == "cat"
    assert isinstance(moved["p"], Pair) and isinstance(moved["p"].b, list)
    assert isinstance(moved["o"], OrderedDict) and isinstance(moved["e"], Encoding) and moved["n"] == 3


class SizedStream(Stream):
    def __len__(self):
        return self.n


@pytest.mark.parametrize("n", [0, 5, 8, 23, 37])
@pytest.mark.parametrize("split, drop_last", [(False, False), (True, False), (False, True)])
def test_iterable_shard_len_matches_what_it_yields(n, split, drop_last):
    for rank in range(2):
        shard = IterableDatasetShard(SizedStream(n), 4, drop_last, num_processes=2, process_index=rank,
                                     split_batches=split)
        if not split:  # (Accelerate's length counts whole per-process batches; split shards yield half of that)
            assert len(shard) == len(list(shard))


class _PlainBatchSampler(BatchSampler):
    """A BatchSampler subclass: not recognised as seekable, so sharding takes the general batch-by-batch path."""


@pytest.mark.parametrize("kind", ["sequential", "keyed", "sized-sequential"])
def test_sliced_sharding_gives_the_batches_of_the_batch_by_batch_path(kind):
    """The fast path (slices of the order's runs) against the general one, over every small layout and seek."""
    from hasten.data.order import SampleOrder

    def order(total):
        if kind == "keyed":
            return SampleOrder(total, kind="keyed", seed=3)
        if kind == "sized-sequential":  # more samples than items: the order cycles
            return SampleOrder(total, kind="sequential", num_samples=total + 5)
        return SampleOrder(total, kind="sequential")

    compared = 0
    for total, size, n, drop_last, even in itertools.product(range(0, 23), (1, 2, 5), (1, 2, 3), (False, True),
                                                             (True, False)):
        for rank in range(n):
            for seek in (None, 1, 3):
                passes = []
                for cls in (BatchSampler, _PlainBatchSampler):
                    sharded = ShardedBatchSampler(cls(order(total), size, drop_last), n, rank, even_batches=even)
                    if seek is not None and not sharded.seek(seek) and cls is BatchSampler:
                        pytest.fail("a plain BatchSampler over a SampleOrder must seek")
                    if seek is not None and cls is _PlainBatchSampler:  # the general path skips by drawing
                        batches = list(sharded)[seek:]
                    else:
                        batches = list(sharded)
                    passes.append(batches + list(sharded))  # and the next pass starts at 0 again
                assert passes[0] == passes[1], (total, size, n, rank, drop_last, even, seek)
                compared += 1
    assert compared > 1000
