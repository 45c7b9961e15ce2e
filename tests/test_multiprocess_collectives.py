"""Collectives on nested structures and PartialState helpers on 2 processes (no Accelerator involved)."""

from __future__ import annotations

import pytest

from conftest import launch_ranks

SCRIPT = "mp_collectives.py"


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return launch_ranks(SCRIPT, tmp_path_factory.mktemp("collectives"))


def t(dtype, shape, values):
    return {"dtype": f"torch.{dtype}", "shape": shape, "values": values}


@pytest.mark.multiprocess
def test_partial_state_identity(ranks):
    for rank, result in ranks.items():
        assert result["num_processes"] == 2
        assert result["process_index"] == rank == int(result["env_rank"])
        assert result["use_distributed"] is True
        assert result["is_main_process"] is (rank == 0)
        assert result["is_local_main_process"] is (rank == 0)
        assert result["is_last_process"] is (rank == 1)


@pytest.mark.multiprocess
def test_gather_nested(ranks):
    expected = {
        "list": [t("float32", [4], [0.0, 0.5, 1.0, 1.5]), t("int64", [2, 3], [[0, 0, 0], [1, 1, 1]])],
        "tuple": {"tuple": [t("float32", [2], [10.0, 11.0]), t("float32", [4, 1], [[0.0], [1.0], [1.0], [2.0]])]},
        "scalar": t("int64", [2], [1, 2]),  # 0-d tensors become one entry per process
    }
    for result in ranks.values():
        assert result["gather"] == expected


@pytest.mark.multiprocess
def test_reduce_sum_mean_scale(ranks):
    for rank, result in ranks.items():
        assert result["reduce_sum"] == {"tuple": [t("float32", [], 21.0), t("float32", [2, 1], [[1.0], [3.0]])]}
        assert result["reduce_mean"] == {"a": [t("float32", [2], [0.5, 2.0])], "b": t("float32", [], 1.5)}
        assert result["reduce_scaled"] == t("float32", [2], [1.0, 0.5])
        assert result["input_after_reduce"] == t("float32", [], 10.0 + rank), "reduce must not modify its input"


@pytest.mark.multiprocess
def test_broadcast(ranks):
    for result in ranks.values():
        assert result["broadcast_from_0"] == {"w": [t("float32", [2], [0.0, 0.0]), {"tuple": [t("int64", [], 0)]}]}
        assert result["broadcast_from_1"] == {"v": t("float32", [2], [1.0, 1.0])}
        assert result["broadcast_object_list"] == [{"rank": 0, "name": "from0"}, "x", None]
        assert result["broadcast_object_list_from_1"] == [1, [1, 1, 1]]


@pytest.mark.multiprocess
def test_gather_object(ranks):
    for result in ranks.values():
        assert result["gather_object_list"] == ["r0a", "r1a", "r1b"]  # ragged lists are concatenated in rank order
        assert result["gather_object_item"] == [{"rank": 0}, {"rank": 1}]


@pytest.mark.multiprocess
def test_pad_across_processes(ranks):
    r0, r1 = ranks[0], ranks[1]
    assert r0["pad_last"] == t("int64", [4], [0, 1, -1, -1])
    assert r0["pad_first"] == t("int64", [4], [-1, -1, 0, 1])
    assert r1["pad_last"] == r1["pad_first"] == t("int64", [4], [100, 101, 102, 103])  # already the longest
    for result in (r0, r1):
        assert result["pad_gathered"] == {"ids": [t("int64", [8], [0, 1, -1, -1, 100, 101, 102, 103])]}
    assert r0["pad_dim1"] == t("float32", [2, 4], [[1.0, 1.0, 0.0, 0.0]] * 2)
    assert r1["pad_dim1"] == t("float32", [2, 4], [[2.0] * 4] * 2)
    assert r0["pad_dim1_first"] == {"m": {"tuple": [t("float32", [2, 4], [[7.0, 7.0, 1.0, 1.0]] * 2)]}}
    assert r1["pad_dim1_first"] == {"m": {"tuple": [t("float32", [2, 4], [[2.0] * 4] * 2)]}}


@pytest.mark.multiprocess
def test_split_between_processes(ranks):
    r0, r1 = ranks[0], ranks[1]
    assert r0["split"] == ["a", "b", "c"] and r1["split"] == ["d", "e"]
    assert r0["split_padded"] == ["a", "b", "c"] and r1["split_padded"] == ["d", "e", "e"]
    assert r0["split_dict"] == {"x": ["a", "b", "c"], "y": [0, 1, 2]}
    assert r1["split_dict"] == {"x": ["d", "e"], "y": [3, 4]}
    assert r0["split_tensor_padded"] == [0, 1, 2] and r1["split_tensor_padded"] == [3, 4, 4]
    assert r0["split_gathered"] == r1["split_gathered"] == [0, 1, 2, 3, 4, 4]


@pytest.mark.multiprocess
def test_process_decorators(ranks):
    assert ranks[0]["decorated"] == ["main", None, None, "local main"]
    assert ranks[1]["decorated"] == [None, "last", "one", None]


@pytest.mark.multiprocess
def test_main_process_first_ordering(ranks):
    main, other = ranks[0]["main_first"], ranks[1]["main_first"]
    assert main["marker_seen_on_entry"] is False
    assert other["marker_seen_on_entry"] is True, "rank 1 entered before rank 0 finished its block"
    assert other["entered"] >= main["entered"] + 0.9  # rank 0 slept 1 s inside the block
