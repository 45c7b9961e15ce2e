"""Mixed precision on 2 processes: bf16 trains; fp16 loss scaling skips inf steps (optimizer and scheduler)."""

from __future__ import annotations

import pytest

from conftest import launch_ranks

SCRIPT = "mp_precision.py"
SKIPPED_STEPS = {2, 4}  # the script's SKIP_LOSS (inf loss on rank 1 only) and SKIP_GRAD (inf gradient on all ranks)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return launch_ranks(SCRIPT, tmp_path_factory.mktemp("precision"))


@pytest.mark.multiprocess
def test_bf16_trains(ranks):
    for rank, result in ranks.items():
        bf16 = result["bf16"]
        assert bf16["mixed_precision"] == "bf16"
        assert bf16["inner_dtype"] == "torch.bfloat16", "the prepared model's forward must run under bf16 autocast"
        assert bf16["output_dtype"] == "torch.float32", "... and hand its outputs back in fp32, as Accelerate does"
        assert bf16["param_dtypes"] == ["torch.float32"], "master weights stay fp32"
        losses = bf16["epoch_losses"]
        assert losses[-1] < 0.25 * losses[0], f"rank {rank}: bf16 training did not lower the loss: {losses}"
    assert ranks[0]["bf16"]["final_params"] == ranks[1]["bf16"]["final_params"], "DDP replicas diverged"
    assert ranks[0]["bf16"]["epoch_losses"] == ranks[1]["bf16"]["epoch_losses"]


@pytest.mark.multiprocess
def test_fp16_skips_inf_steps(ranks):
    for rank, result in ranks.items():
        fp16 = result["fp16"]
        assert fp16["mixed_precision"] == "fp16"
        steps = fp16["steps"]
        assert len(steps) == 8
        expected_count, scale = 0, 256.0
        for i, step in enumerate(steps):
            where = f"rank {rank} step {i}"
            assert (step["inner_dtype"], step["output_dtype"]) == ("torch.float16", "torch.float32"), where
            skipped = i in SKIPPED_STEPS
            assert step["skipped"] is skipped, f"{where}: optimizer_step_was_skipped"
            assert step["params_changed"] is not skipped, f"{where}: parameters must change exactly on real steps"
            assert step["params_finite"], where
            if skipped:
                scale /= 2  # the scaler backs off
            else:
                expected_count += 2  # two processes: Accelerate's scheduler steps twice per optimizer step
            assert step["scale"] == scale, where
            assert step["scheduler_steps"] == expected_count, f"{where}: the scheduler must not advance on a skipped step"
            assert step["lr"] == pytest.approx(0.01 * 0.5**expected_count), where
        assert expected_count == 12
