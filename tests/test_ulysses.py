"""Sequence parallelism (ALST/Ulysses) through DeepSpeed: its options, its refusals, and a 2-process run on gloo
whose losses and parameters equal one process training on whole sequences.

Tolerances (measured with tests/scripts/ds_ulysses.py, ZeRO 1, 2 and 3 alike): the losses differ by at most
5e-7 (float32 sums taken in another order: attention over head shards, the loss as a token-weighted mean of
two halves); parameters after 4 AdamW steps at lr 1e-3 by at most ~7e-7 (Adam divides by the gradient's own
size, so a coordinate whose gradient is near eps turns rounding into a visible update). 1e-5 leaves a 10x margin
on both and is far below what one wrong shard or a missing weight would do (losses ~4.2 move by ~1e-2 a step).
"""

from __future__ import annotations

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("transformers")

from conftest import launch, results_by_rank  # noqa: E402
from hasten.core.errors import ConfigError  # noqa: E402
from hasten.parallelism_config import ParallelismConfig  # noqa: E402
from hasten.utils import DeepSpeedSequenceParallelConfig  # noqa: E402

TOLERANCE = 1e-5


def test_the_options_keep_accelerates_fields_defaults_and_checks(monkeypatch):
    config = DeepSpeedSequenceParallelConfig()
    assert (config.sp_seq_length, config.sp_seq_length_is_variable, config.sp_attn_implementation) == (None, True, None)
    assert DeepSpeedSequenceParallelConfig(sp_attn_implementation="kernels-community/flash-attn2").sp_attn_implementation
    for bad in ("eager", "flex_attention", "magic"):
        with pytest.raises(ConfigError, match=f"Invalid sp_attn_implementation: '{bad}'"):
            DeepSpeedSequenceParallelConfig(sp_attn_implementation=bad)
    with pytest.raises(ConfigError, match="pass sp_seq_length"):
        DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=False)
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE", "false")
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SEQ_LENGTH", "256")
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION", "sdpa")
    config = DeepSpeedSequenceParallelConfig()
    assert (config.sp_seq_length, config.sp_seq_length_is_variable, config.sp_attn_implementation) == (256, False, "sdpa")

    parallel = ParallelismConfig(sp_size=2)
    assert parallel.sp_enabled and parallel.sp_backend == "deepspeed"
    assert isinstance(parallel.sp_handler, DeepSpeedSequenceParallelConfig)
    assert ParallelismConfig().sp_handler is None and not ParallelismConfig().sp_enabled
    with pytest.raises(ValueError, match="sp_backend must be 'deepspeed', got 'torch'"):
        ParallelismConfig(sp_size=2, sp_backend="torch")


def test_sequence_parallelism_is_refused_where_it_cannot_run():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from hasten import Accelerator
    from hasten.strategies.deepspeed.ulysses import _attention_of, check_sequence_parallel

    with pytest.raises(ValueError, match="pass deepspeed_plugin=DeepSpeedPlugin"):
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(sp_size=2))
    with pytest.raises(ConfigError, match="must divide the number of processes"):
        check_sequence_parallel(ParallelismConfig(sp_size=2), 3)
    with pytest.raises(ConfigError, match="tensor or context parallelism"):
        check_sequence_parallel(ParallelismConfig(sp_size=2, tp_size=2, dp_shard_size=2), 8)
    with pytest.raises(ConfigError, match="has no `config`"):
        _attention_of(torch.nn.Linear(2, 2), None)
    config = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2)
    eager = LlamaForCausalLM._from_config(config, attn_implementation="eager")
    with pytest.raises(ConfigError, match="runs attention with 'eager'"):
        _attention_of(eager, "sdpa")
    sdpa = LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    assert _attention_of(sdpa, None) == "sdpa"  # None: the model's own


@pytest.fixture(scope="module")
def ulysses_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ulysses")
    launch("ds_ulysses.py", str(out), "3", num_processes=2, timeout=240)
    results = results_by_rank(out)
    assert sorted(results) == [0, 1]
    return results


@pytest.mark.multiprocess
def test_two_processes_train_as_one_on_whole_sequences(ulysses_run):
    for rank, result in ulysses_run.items():
        assert len(result["losses"]) == len(result["ref_losses"]) == 4
        assert max(abs(a - b) for a, b in zip(result["losses"], result["ref_losses"])) < TOLERANCE
        assert result["param_diff"] < TOLERANCE
        assert result["losses"][0] != result["losses"][-1]  # it trained
    assert ulysses_run[0]["losses"] == ulysses_run[1]["losses"]  # one loss per group


@pytest.mark.multiprocess
def test_each_process_gets_its_half_of_every_sequence(ulysses_run):
    for rank, result in ulysses_run.items():
        assert result["adapter"] == "SequenceShardedLoader" and result["len"] == 2 * result["inner_len"] == 4
        assert {tuple(s["shape"]) for s in result["shards"]} == {(2, 8)}  # batch 2, half of 16 tokens
        assert {s["first_position"] for s in result["shards"]} == {8 * rank}
        assert all(s["contiguous"] and s["keys"] == ["input_ids", "position_ids", "shift_labels"]
                   for s in result["shards"])
        assert result["second_first_shape"] == [2, 8]  # deepspeed_ulysses_dl_adapter on a loader prepared alone
        assert result["train_batch_size"] == 2  # ZeRO's data parallel is world / sp_size = 1 process
        assert result["mesh"]  # torch_device_mesh is None under DeepSpeed's SP, as in Accelerate


@pytest.mark.multiprocess
def test_a_run_resumed_from_save_state_continues_exactly(ulysses_run):
    for rank, result in ulysses_run.items():  # loaded after step 2 (other initial weights), trained steps 3-4
        assert result["resumed_losses"] == result["losses"][2:], f"rank {rank}"
        assert result["resumed_bitwise"], f"rank {rank}: parameters differ by {result['resumed_diff']}"
