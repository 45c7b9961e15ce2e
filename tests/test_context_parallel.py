"""Context parallel: buffer sharding, load balancing and restore (unit), then real 2- and 4-process runs on gloo.

The runs (tests/scripts/cp_train.py: cp 2, and dp_shard 2 x cp 2) train two steps inside
`maybe_context_parallel` with the CPU path (gathered-KV attention) and must
match the 1-process model: the loss averaged over ``torch_device_mesh["dp_cp"]``,
every gradient and every updated parameter within 1e-5.
"""

import pytest
import torch
from torch.distributed.tensor.experimental._attention import _HeadTailLoadBalancer

from conftest import launch_ranks
from hasten.core.errors import ConfigError
from hasten.parallelism_config import ParallelismConfig
from hasten.strategies.parallel.context import (TorchContextParallelConfig, context_parallel_context,
                                                drop_attention_masks, gathered_kv_context_parallel,
                                                load_balanced_positions, restore_buffers, shard_buffers)
from hasten.utils import TorchContextParallelConfig as FromUtils


@pytest.mark.parametrize("seq_len, cp_size", [(8, 2), (12, 3), (16, 4), (32, 2)])
def test_positions_are_torchs_head_tail_order(seq_len, cp_size):
    order = _HeadTailLoadBalancer(seq_len, cp_size, "cpu")._generate_indices()[0].long()
    ours = torch.cat([load_balanced_positions(seq_len, cp_size, rank) for rank in range(cp_size)])
    assert torch.equal(ours, order)
    chunk = seq_len // (2 * cp_size)
    assert load_balanced_positions(seq_len, cp_size, 0).tolist()[chunk:] == list(range(seq_len - chunk, seq_len))


def test_positions_without_balancing_and_uneven_lengths():
    assert [load_balanced_positions(6, 2, r).tolist() for r in range(2)] == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ConfigError, match="cannot be split evenly over cp_size=2.*multiple of 4"):
        load_balanced_positions(7, 2, 0)


def test_shard_and_restore_in_place_keep_no_restore_buffers_sharded():
    ids = torch.arange(16).view(2, 8)
    hidden = torch.arange(16.0).view(8, 2)  # sequence dim 0
    labels = ids.clone() + 100
    keep = shard_buffers([ids, hidden, labels], [1, 0, 1], cp_size=2, cp_rank=1, no_restore={labels})
    assert ids.tolist() == [[2, 3, 4, 5], [10, 11, 12, 13]]  # chunks 1 and 2 of 4
    assert hidden[:, 0].tolist() == [4.0, 6.0, 8.0, 10.0] and labels.tolist() == [[102, 103, 104, 105], [110, 111, 112, 113]]
    assert keep[2] is None
    restore_buffers([ids, hidden, labels], keep)
    assert torch.equal(ids, torch.arange(16).view(2, 8)) and torch.equal(hidden, torch.arange(16.0).view(8, 2))
    assert labels.shape == (2, 4)


@pytest.mark.parametrize("buffers, dims, no_restore, message", [
    ([torch.zeros(1, 4)], [1, 1], (), "1 buffers but 2 buffer_seq_dims"),
    ([torch.zeros(1, 4)], [1], (torch.zeros(1, 4),), "must be a subset of buffers"),
    ([torch.zeros(1, 4), torch.zeros(1, 8)], [1, 1], (), r"different sequence lengths \[4, 8\]"),
])
def test_shard_buffers_refuses_mismatches(buffers, dims, no_restore, message):
    with pytest.raises(ConfigError, match=message):
        shard_buffers(buffers, dims, cp_size=2, cp_rank=0, no_restore=no_restore)


def test_config_accepts_cp_with_accelerates_handler(monkeypatch):
    config = ParallelismConfig(dp_shard_size=2, cp_size=2)
    assert FromUtils is TorchContextParallelConfig
    assert config.cp_backend == "torch" and config.cp_handler == TorchContextParallelConfig("allgather")
    assert config.mesh_dim_names == ("dp_shard", "cp") and config.needs_sharded_engine
    assert config.dp_shard_cp_dim_names == ["dp_shard", "cp"] and config.dp_cp_dim_names == ["dp_shard", "cp"]
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "alltoall")
    assert ParallelismConfig(cp_size=2).cp_handler.cp_comm_strategy == "alltoall"
    with pytest.raises(ConfigError, match="Invalid cp_comm_strategy: ring is not a context-parallel strategy"):
        TorchContextParallelConfig("ring")
    with pytest.raises(ValueError, match="cp_handler must be a TorchContextParallelConfig"):
        ParallelismConfig(cp_size=2, cp_handler={"cp_comm_strategy": "allgather"})


def test_drop_attention_masks_like_accelerate():
    class Attention(torch.nn.Module):
        def forward(self, x, attention_mask=None, is_causal=False):
            return attention_mask, is_causal

    model = torch.nn.Module()
    model.self_attn = Attention()
    drop_attention_masks(model)
    assert model.self_attn(torch.ones(1), attention_mask=torch.ones(2, 2)) == (None, True)
    model.config = type("Config", (), {"sliding_window": 4})()
    with pytest.raises(ConfigError, match=r"\['sliding_attention'\] layers; use a full-attention model or cp_size=1"):
        drop_attention_masks(model)
    model.config = type("Config", (), {"_attn_implementation": "eager"})()
    with pytest.raises(ConfigError, match="uses attn_implementation='eager'; load it with attn_implementation='sdpa'"):
        drop_attention_masks(model)


def test_cuda_meshes_get_torchs_context_parallel_with_the_handlers_rotation():
    from torch.distributed.tensor.experimental import _attention as torch_cp

    cuda_mesh = type("Mesh", (), {"device_type": "cuda"})()
    try:
        made = context_parallel_context(cuda_mesh, TorchContextParallelConfig("alltoall"))
        assert made.func is torch_cp.context_parallel and made.args == (cuda_mesh,)
        assert torch_cp._cp_options.rotate_method == torch_cp._RotateMethod.ALL_TO_ALL
    finally:
        torch_cp.set_rotate_method("allgather")
    cpu_mesh = type("Mesh", (), {"device_type": "cpu"})()
    assert context_parallel_context(cpu_mesh, None).func is gathered_kv_context_parallel


# -- real processes ----------------------------------------------------------------
@pytest.fixture(scope="module", params=[2, 4], ids=["cp2", "dp_shard2_x_cp2"])
def cp_runs(request, tmp_path_factory):
    return launch_ranks("cp_train.py", tmp_path_factory.mktemp("cp"), num_processes=request.param)


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_context_parallel_on_cpu_equals_one_process(cp_runs):
    """Every rank's loss over the dp_cp group, gradients and updated parameters are the 1-process model's."""
    four = len(cp_runs) == 4
    for rank, report in cp_runs.items():
        assert report["mesh"] == (["dp_shard", "cp"] if four else ["cp"]) and report["dp_cp_size"] == len(cp_runs)
        assert report["dp_rank"] == (rank // 2 if four else 0)
        expected = [[0, 1], [4, 5]] if four and rank < 2 else [[2, 3], [6, 7]] if four else [[0, 1], [2, 3], [4, 5], [6, 7]]
        assert report["batches"] == expected, "the CP ranks of one data-parallel group read the same batches"
        for seq in (8, 6):  # 8: head-tail balanced; 6: contiguous halves
            step = report[f"seq{seq}"]
            assert step["tokens_inside"] == seq // 2 and step["ids_restored"]
            assert step["labels_kept_sharded"] == seq // 2 and step["labels_are_my_slice"]
            assert step["local_loss_differs"] > 1e-3  # each rank really saw only its half
            assert step["loss_diff"] <= 1e-5 and step["grad_max_diff"] <= 1e-5 and step["param_max_diff"] <= 1e-5, (rank, seq, step)


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_context_parallel_resumes_from_save_state_exactly(cp_runs):
    for rank, result in cp_runs.items():  # trained 4 steps vs loaded after 2 and trained 2 more: bit for bit
        assert result["resume"]["bitwise"], f"rank {rank}: parameters differ by {result['resume']['max_diff']}"
