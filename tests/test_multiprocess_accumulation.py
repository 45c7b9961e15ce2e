"""Gradient accumulation on 2 processes really skips the all-reduce, and steps optimizer/scheduler once per sync."""

from __future__ import annotations

import pytest

from conftest import launch_ranks

SCRIPT = "mp_accumulation_hooks.py"
# gradient_accumulation_steps=4: loader "a" has 8 batches per rank, loader "b" 6 (its last sync is the loader's end)
EXPECTED_SYNC = {
    "a": [False, False, False, True, False, False, False, True],
    "b": [False, False, False, True, False, True],
}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return launch_ranks(SCRIPT, tmp_path_factory.mktemp("accumulation"))


@pytest.mark.multiprocess
def test_model_is_wrapped_in_ddp(ranks):
    for result in ranks.values():
        assert result["type"] == "DistributedDataParallel"
        assert result["loaders"]["a"]["len"] == 8
        assert result["loaders"]["b"]["len"] == 6


@pytest.mark.multiprocess
@pytest.mark.parametrize("loader", ["a", "b"])
def test_allreduce_only_on_sync_steps(ranks, loader):
    for rank, result in ranks.items():
        steps = result["loaders"][loader]["steps"]
        assert [s["sync_gradients"] for s in steps] == EXPECTED_SYNC[loader], f"rank {rank}"
        # exactly one bucket all-reduce (the model fits in one bucket) on sync steps, none otherwise
        assert [s["allreduces"] for s in steps] == [int(sync) for sync in EXPECTED_SYNC[loader]], f"rank {rank}"


@pytest.mark.multiprocess
@pytest.mark.parametrize("loader", ["a", "b"])
def test_gradients_local_until_sync(ranks, loader):
    """Accumulated gradients differ between ranks until the sync step, where they are identical (averaged)."""
    steps0, steps1 = ranks[0]["loaders"][loader]["steps"], ranks[1]["loaders"][loader]["steps"]
    for i, (s0, s1) in enumerate(zip(steps0, steps1)):
        if EXPECTED_SYNC[loader][i]:
            assert s0["grad_after_backward"] == pytest.approx(s1["grad_after_backward"], abs=1e-7), f"micro-step {i + 1}"
            assert s0["grad_cleared"] and s1["grad_cleared"], "zero_grad must clear gradients after the real step"
        else:
            assert s0["grad_after_backward"] != pytest.approx(s1["grad_after_backward"], abs=1e-6), (
                f"micro-step {i + 1}: gradients equal across ranks on a non-sync step (all-reduce not skipped?)"
            )
            assert not s0["grad_cleared"], "zero_grad must not clear accumulated gradients on a non-sync step"


@pytest.mark.multiprocess
def test_optimizer_and_scheduler_step_only_on_sync_steps(ranks):
    """As Accelerate: the scheduler advances num_processes (2) times per real optimizer step, never on a micro-batch."""
    for rank, result in ranks.items():
        expected_count, lr = 0, result["initial_lr"]
        for loader in ("a", "b"):
            for i, step in enumerate(result["loaders"][loader]["steps"]):
                sync = EXPECTED_SYNC[loader][i]
                assert step["params_changed"] == sync, f"rank {rank} loader {loader} micro-step {i + 1}"
                if sync:
                    expected_count += 2
                    lr *= 0.9 * 0.9
                assert step["scheduler_steps"] == expected_count, f"rank {rank} loader {loader} micro-step {i + 1}"
                assert step["lr"] == pytest.approx(lr, rel=1e-9)
        assert expected_count == 8
    assert ranks[0]["final_weight"] == ranks[1]["final_weight"]
