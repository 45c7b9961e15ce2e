"""Data sharding across 2 processes: disjoint shards, full coverage, agreed per-epoch shuffles, gather_for_metrics."""

from __future__ import annotations

import pytest

from conftest import launch_ranks

SCRIPT = "mp_sharding.py"
N_MAP = 33  # batch 4 per rank -> 9 inner batches, the last with 1 sample


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return launch_ranks(SCRIPT, tmp_path_factory.mktemp("sharding"))


def global_order(batches0, batches1):
    """The samples in the order a single process would see them: step k = rank 0's batch k, then rank 1's."""
    order = []
    for k in range(max(len(batches0), len(batches1))):
        for batches in (batches0, batches1):
            if k < len(batches):
                order += batches[k]
    return order


def flat(batches):
    return [i for b in batches for i in b]


@pytest.mark.multiprocess
@pytest.mark.parametrize("shuffle", [False, True])
def test_map_style_uneven_every_sample_once(ranks, shuffle):
    case = f"map_even0_shuffle{int(shuffle)}"
    r0, r1 = ranks[0][case], ranks[1][case]
    assert (r0["len"], r1["len"]) == (5, 4)  # 9 batches: rank 0 gets one more
    for epoch in range(2):
        b0, b1 = r0["epochs"][epoch], r1["epochs"][epoch]
        assert (len(b0), len(b1)) == (r0["len"], r1["len"]), "len(prepared_loader) must equal the batches yielded"
        assert set(flat(b0)).isdisjoint(flat(b1))
        order = global_order(b0, b1)
        assert sorted(order) == list(range(N_MAP)), "each sample exactly once per epoch"
        if not shuffle:
            assert order == list(range(N_MAP))
        assert all(len(b) == 4 for b in b0[:-1] + b1)


@pytest.mark.multiprocess
@pytest.mark.parametrize("shuffle", [False, True])
def test_map_style_even_batches_wrap_around(ranks, shuffle):
    case = f"map_even1_shuffle{int(shuffle)}"
    r0, r1 = ranks[0][case], ranks[1][case]
    assert r0["len"] == r1["len"] == 5
    for epoch in range(2):
        b0, b1 = r0["epochs"][epoch], r1["epochs"][epoch]
        assert len(b0) == len(b1) == 5, "even_batches: all ranks step equally often, as len() says"
        assert all(len(b) == 4 for b in b0 + b1), "the last batch is completed, not short"
        order = global_order(b0, b1)
        permutation = order[:N_MAP]
        assert sorted(permutation) == list(range(N_MAP)), "the real samples are one permutation shared by the ranks"
        assert order[N_MAP:] == permutation[: 40 - N_MAP], "padding wraps around to the epoch's first samples"
        if not shuffle:
            assert permutation == list(range(N_MAP))


@pytest.mark.multiprocess
@pytest.mark.parametrize("even", [0, 1])
def test_shuffle_changes_per_epoch_and_ranks_agree(ranks, even):
    case = f"map_even{even}_shuffle1"
    r0, r1 = ranks[0][case], ranks[1][case]
    perms = [global_order(r0["epochs"][e], r1["epochs"][e])[:N_MAP] for e in range(2)]
    for perm in perms:
        assert sorted(perm) == list(range(N_MAP))  # a permutation => the two ranks used the same order
    assert perms[0] != perms[1], "the shuffle must change between epoch 0 and epoch 1"
    assert perms[0] != list(range(N_MAP)), "shuffle=True must shuffle"
    # As under Accelerate, set_epoch(0) does not rewind a RandomSampler's generator: a third pass, a third
    # order (still shared by the ranks). (use_seedable_sampler=True is what makes an epoch replayable.)
    third = global_order(r0["replay0"], r1["replay0"])[:N_MAP]
    assert sorted(third) == list(range(N_MAP)) and third not in perms


@pytest.mark.multiprocess
def test_split_batches_sharding(ranks):
    # global batch 8 cut into 2 x 4; 33 samples -> 5 global batches, the last with 1 sample
    u0, u1 = ranks[0]["split_even0"], ranks[1]["split_even0"]
    assert (u0["len"], u1["len"]) == (5, 5)  # as in Accelerate, len() counts the short last batch on both
    e0, e1 = ranks[0]["split_even1"], ranks[1]["split_even1"]
    assert e0["len"] == e1["len"] == 5
    for epoch in range(2):
        b0, b1 = u0["epochs"][epoch], u1["epochs"][epoch]
        assert (len(b0), len(b1)) == (5, 4)
        assert set(flat(b0)).isdisjoint(flat(b1))
        assert sorted(global_order(b0, b1)) == list(range(N_MAP))
        b0, b1 = e0["epochs"][epoch], e1["epochs"][epoch]
        assert len(b0) == len(b1) == 5 and all(len(b) == 4 for b in b0 + b1)
        order = global_order(b0, b1)
        assert sorted(order[:N_MAP]) == list(range(N_MAP))
        assert order[N_MAP:] == order[: 40 - N_MAP]
    assert global_order(*[r["split_even1"]["epochs"][0] for r in (ranks[0], ranks[1])]) != global_order(
        *[r["split_even1"]["epochs"][1] for r in (ranks[0], ranks[1])]
    )


@pytest.mark.multiprocess
def test_iterable_dataset_is_dispatched_and_completed_from_the_start(ranks):
    # As under Accelerate, the Accelerator dispatches an iterable dataset (rank 0 reads, every rank gets its
    # rows) and completes the short last global batch from the pass's first rows, whatever even_batches says.
    for case in ("iter_even0", "iter_even1"):
        b0, b1 = ranks[0][case]["epochs"][0], ranks[1][case]["epochs"][0]
        assert b0[0] == [0, 1, 2, 3] and b1[0] == [4, 5, 6, 7]
        assert len(b0) == len(b1) == 5
        # the last global batch [32..36] has 5 rows: each rank keeps 3 of [32..36, 0, 1]
        assert b0[-1] == [32, 33, 34] and b1[-1] == [35, 36, 0]
        assert global_order(b0, b1) == list(range(37)) + [0]


@pytest.mark.multiprocess
def test_gather_for_metrics_drops_the_padding(ranks):
    for rank, result in ranks.items():
        g = result["gather_for_metrics"]
        assert g["len"] == 7 and len(g["local_batch_sizes"]) == 7  # ceil(13 batches / 2)
        assert g["local_batch_sizes"] == [8] * 7  # even_batches: the last step is padded on both ranks
        assert g["indices"] == list(range(101)), f"rank {rank}: gather_for_metrics must return the dataset, in order"
        assert g["feats"] == [[float(i), -float(i)] for i in range(101)]
        assert g["names"] == [f"s{i}" for i in range(101)], "non-tensor data (gather_object path)"
        # plain gather keeps the 11 wrap-around duplicates: the trimming is gather_for_metrics' doing
        assert g["plain_gather"] == list(range(101)) + list(range(11))
        assert g["exact"] == list(range(32)), "nothing dropped when the dataset divides evenly"
        for case in ("gfm_shuffled", "gfm_split"):
            values = result[case]
            assert len(values) == 101 and sorted(values) == list(range(101)), f"rank {rank} {case}"
            assert values != list(range(101)), f"rank {rank} {case}: not shuffled"
    assert ranks[0]["gfm_shuffled"] == ranks[1]["gfm_shuffled"]


# An IterableDataset with __len__ (37 items, batch 4 per rank, 2 ranks): 5 batches per rank, the last one
# padded by wrap-around. On 1 process `len(loader)` works and gather_for_metrics returns 37 items; the same
# script must behave the same on 2 processes.


@pytest.mark.multiprocess
def test_sized_iterable_dataset_len(ranks):
    for rank in (0, 1):
        sized = ranks[rank]["sized_iter"]
        assert len(sized["batches"]) == 5
        assert sized["len"] == 5, f"rank {rank}: len(prepared_loader) of a sized iterable dataset: {sized['len']}"


@pytest.mark.multiprocess
def test_sized_iterable_dataset_gather_for_metrics(ranks):
    for rank in (0, 1):
        gathered = ranks[rank]["sized_iter"]["gathered"]
        assert gathered == list(range(37)), (
            f"rank {rank}: gather_for_metrics returned {len(gathered)} items for a 37-item dataset, "
            f"ending with {gathered[-5:]} (the wrap-around padding was not dropped)"
        )
