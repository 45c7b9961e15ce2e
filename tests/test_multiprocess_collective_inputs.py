"""Collectives on 2 processes with awkward inputs, and shape/dtype/operation mismatches as errors by default."""

import pytest

from conftest import SCRIPTS, launch, results_by_rank

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module", params=["board", "all-reduce"])
def ranks(request, tmp_path_factory):
    """Both ways of comparing signatures: shared memory (one machine) and the all-reduce (several machines)."""
    out = tmp_path_factory.mktemp("inputs")
    launch("mp_collective_inputs.py", str(out), request.param)
    results = results_by_rank(out)
    assert sorted(results) == [0, 1]
    assert results[0]["path"] == results[1]["path"] == request.param
    return results


def test_gather_of_awkward_tensors_is_the_same_on_every_rank(ranks):
    assert ranks[0]["gather"] == ranks[1]["gather"]
    gathered = ranks[0]["gather"]
    assert gathered["grad"][:2] == [[4, 3], "torch.float32"] and gathered["grad"][3] is False  # no graph leaks out
    assert gathered["grad"][2] == [[2.0] * 3] * 2 + [[4.0] * 3] * 2
    assert gathered["t"][0] == [6, 2] and gathered["t"][2][3] == [1.0, 4.0]  # non-contiguous input, rank 1's rows
    assert gathered["scalar"][:3] == [[2], "torch.int64", [0, 1]]  # 0-d becomes 1-d
    assert gathered["empty"][:3] == [[0, 4], "torch.float32", []]
    assert gathered["ints"][:3] == [[2], "torch.int32", [0, 1]]  # mixed dtypes keep their own


def test_every_reduction(ranks):
    for rank in (0, 1):
        assert ranks[rank]["reduce"] == {"sum": [3.0, -5.0], "mean": [1.5, -2.5], "max": [2.0, -2.0], "min": [1.0, -3.0],
                                         "product": [2.0, 6.0], "int_mean": [1.5], "0d": 2.0}
        assert ranks[rank]["broadcast"] == [6.0, 6.0, 6.0]  # a non-contiguous tensor is updated in place
        assert ranks[rank]["pad"] == 2


def script_line(marker: str) -> int:
    """The line of the test script that holds `marker` (the call site the errors must name)."""
    lines = (SCRIPTS / "mp_collective_inputs.py").read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if marker in line)


def test_mismatches_raise_one_sentence_on_every_rank_without_debug_mode(ranks):
    assert ranks[0]["errors"] == ranks[1]["errors"]
    errors = ranks[0]["errors"]
    same, ops = script_line('"same_count":'), script_line('"different_ops":')
    assert errors["same_count"] == (
        f"CollectiveShapeMismatch: gather needs the same shape and dtype on every process, got rank 0: (4,) float32 at "
        f"mp_collective_inputs.py:{same}, rank 1: (2, 2) float32 at mp_collective_inputs.py:{same}; use "
        "pad_across_processes first or gather_object for ragged data.")
    assert "rank 0: (4,) float32" in errors["different_count"] and "rank 1: (5,) float32" in errors["different_count"]
    assert "rank 0: (3,) float32" in errors["dtype"] and "rank 1: (3,) float64" in errors["dtype"]
    assert errors["different_ops"].startswith("CollectiveOrderMismatch: the processes called different collectives: "
                                              f"rank 0 in gather at mp_collective_inputs.py:{ops}, rank 1 in reduce")
    assert "rank 0: (4,) float32" in errors["small_and_large"] and "rank 1: (200,) float32" in errors["small_and_large"]
    assert errors["pad_and_gather"].startswith("CollectiveOrderMismatch: the processes called different collectives: "
                                               "rank 0 in pad_across_processes")
    assert ranks[0]["after"] == [0, 1]  # the process group still works after the errors


def test_every_dtype_and_size_gives_the_all_reduce_result_on_both_paths(ranks):
    """The board computes small results itself; they must be what torch.distributed gives (the all-reduce path)."""
    assert ranks[0]["kinds"] == ranks[1]["kinds"]
    kinds = ranks[0]["kinds"]
    assert kinds["torch.bfloat16"] == [str(x) for x in ([3.0, 4.0], [2.0, 2.0], [1.0, 2.0, 2.0, 2.0], [2.0, 2.0])]
    assert kinds["torch.int8"] == [str(x) for x in ([3, 4], [2, 2], [1, 2, 2, 2], [2, 2])]
    assert kinds["torch.complex64"][0] == str([(3 + 0j), (4 + 0j)])
    assert kinds["complex max"] == "all_reduce does not support RedOpType.MAX on complex tensors"
    assert kinds["torch.bool"] == [str(x) for x in ([True, True], [True, True], [True, True, True, True], [True, True])]
    for count in (126, 127, 300):
        assert ranks[0][f"sum_{count}"] == ranks[1][f"sum_{count}"] == [3.0 * i for i in range(count)]
        assert ranks[0][f"gather_{count}"] == float(count)
    assert ranks[0]["pad_nested"] == ranks[1]["pad_nested"] == [[2, 2], [3, 4], []]


def test_small_collectives_on_one_machine_make_no_network_call(ranks):
    if ranks[0]["path"] == "board":
        assert ranks[0]["network_calls"] == ranks[1]["network_calls"] == []
    else:
        assert ranks[0]["network_calls"].count("all_reduce") == 5  # 4 checks + the reduce itself


def test_reduce_of_floats_on_three_processes_is_the_all_reduce_bit_for_bit(tmp_path):
    """On 3+ processes a float sum goes over the network: its order, and so its last bit, is gloo's (Accelerate's)."""
    launch("mp_reduce_order.py", str(tmp_path), num_processes=3)
    results = results_by_rank(tmp_path)
    assert sorted(results) == [0, 1, 2]
    for seen in results.values():
        assert seen["ours"] == seen["raw"]
        assert seen["ints"] == [3, 6]
