"""transformers' `Trainer` on hasten through the accelerate switch: the same per-step numbers as on Accelerate.

``scripts/trainer_client.py`` never imports accelerate: `Trainer` does.
Under the peer it runs as a user runs it (``python`` / ``accelerate launch``);
under hasten, unchanged, with ``hasten launch --as-accelerate``. Compared
per rank: the rows of every micro-batch, each micro-batch's exact loss,
the learning rate after every optimizer step, and the evaluation loss.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .harness import HASTEN, PEER, Run, Runs

pytest.importorskip("transformers")
PROCESSES = [pytest.param(1, id="1p"), pytest.param(2, id="2p", marks=pytest.mark.multiprocess)]
pytestmark = [pytest.mark.parity, pytest.mark.timeout(900)]
NAME = "trainer_client"
FEATURES = ("--gradient_accumulation_steps", "2", "--bf16", "--eval_steps", "2", "--save_steps", "2")
ZERO2 = {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
         "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "zero_allow_untested_optimizer": True,
         "zero_force_ds_cpu_optimizer": False}


def trainer_run(runs: Runs, lib: str, nproc: int, *args: str, resume_from: str = "") -> Run:
    run = runs.script(NAME, lib, nproc, *args, resume_from=resume_from, switch=True)
    run.check()
    return run


def of(run: Run, kind: str, rank: int) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("k", "r")} for r in run.records if r["k"] == kind and r["r"] == rank]


def assert_same_steps(peer: Run, ours: Run) -> None:
    """Every rank trained on the same rows with bit-identical losses and learning rates, and evaluated alike."""
    for rank in range(peer.nproc):
        for kind in ("batch", "micro", "step"):
            expected, got = of(peer, kind, rank), of(ours, kind, rank)
            assert expected, f"Accelerate's run wrote no {kind!r} record on rank {rank}"
            if expected != got:
                first = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
                pytest.fail(f"rank {rank}, {kind} record #{first} of {len(expected)}/{len(got)}: Accelerate "
                            f"{expected[first] if first < len(expected) else None} vs hasten "
                            f"{got[first] if first < len(got) else None}", pytrace=False)
    assert [r["eval_loss"] for r in of(peer, "eval", 0)] == [r["eval_loss"] for r in of(ours, "eval", 0)]
    assert of(ours, "done", 0)[0]["accelerate"] == "hasten.accelerator"  # it really ran on hasten


@pytest.mark.parametrize("nproc", PROCESSES)
def test_trainer_trains_the_same_steps(runs: Runs, nproc: int) -> None:
    """On 1 process with ``auto_find_batch_size`` too (Accelerate's find_executable_batch_size around the loop)."""
    args = ("--auto_find_batch_size",) if nproc == 1 else ()
    assert_same_steps(trainer_run(runs, PEER, nproc, *args), trainer_run(runs, HASTEN, nproc, *args))


@pytest.mark.multiprocess
def test_trainer_with_accumulation_bf16_evaluation_and_checkpoints(runs: Runs) -> None:
    peer, ours = trainer_run(runs, PEER, 2, *FEATURES), trainer_run(runs, HASTEN, 2, *FEATURES)
    assert_same_steps(peer, ours)
    assert len(of(ours, "micro", 0)) == 2 * len(of(ours, "step", 0))  # two micro-batches per optimizer step
    assert len([r for r in of(ours, "log", 0) if "eval_loss" in r]) >= 2  # eval_strategy="steps" ran mid-training
    for step in ("checkpoint-2", "checkpoint-4"):  # Trainer's own files, the same names under both
        assert sorted(p.name for p in (peer.out / step).iterdir()) == sorted(p.name for p in (ours.out / step).iterdir())


@pytest.mark.multiprocess
def test_trainer_resumes_from_checkpoint_like_accelerate(runs: Runs) -> None:
    """resume_from_checkpoint: the same steps as Accelerate's resume, and as the run that never stopped."""
    peer = trainer_run(runs, PEER, 2, *FEATURES, resume_from="checkpoint-2")
    ours = trainer_run(runs, HASTEN, 2, *FEATURES, resume_from="checkpoint-2")
    assert_same_steps(peer, ours)
    whole = trainer_run(runs, HASTEN, 2, *FEATURES)
    resumed = of(ours, "micro", 0)
    assert resumed and resumed == of(whole, "micro", 0)[-len(resumed):]


@pytest.mark.multiprocess
@pytest.mark.parametrize("engine", ["fsdp", "zero2"])
def test_trainer_sharded_engines_train_like_ddp(runs: Runs, tmp_path_factory: pytest.TempPathFactory,
                                                engine: str) -> None:
    """FSDP2 and DeepSpeed ZeRO-2 chosen through TrainingArguments: the DDP run's losses, to float32 rounding.

    Both also save and resume to the same steps (FSDP: ``adapter_only=True`` on a model without adapters saves it
    whole, as Accelerate does; DeepSpeed: the engine's own checkpoint, in the same layout as under Accelerate).
    """
    if engine == "fsdp":
        args: tuple[str, ...] = ("--fsdp", "full_shard", "--save_steps", "4")
        expected_type = "DistributedType.FSDP"
    else:
        pytest.importorskip("deepspeed")
        config = Path(runs.root) / "zero2.json"
        config.write_text(json.dumps(ZERO2))
        args, expected_type = ("--deepspeed", str(config), "--save_steps", "4"), "DistributedType.DEEPSPEED"
    ddp, sharded = trainer_run(runs, PEER, 2), trainer_run(runs, HASTEN, 2, *args)
    assert of(sharded, "done", 0)[0]["distributed"] == expected_type
    for rank in range(2):
        assert of(ddp, "batch", rank) == of(sharded, "batch", rank)
        assert of(ddp, "step", rank) == of(sharded, "step", rank)
        expected = [float.fromhex(r["loss"]) for r in of(ddp, "micro", rank)]
        got = [float.fromhex(r["loss"]) for r in of(sharded, "micro", rank)]
        assert len(expected) == len(got) and max(abs(a - b) for a, b in zip(expected, got)) <= 1e-5 * max(map(abs, expected))
    # Trainer's checkpoints (FSDP: save_fsdp_model / save_fsdp_optimizer; DeepSpeed: the engine's) resume exactly
    resumed = of(trainer_run(runs, HASTEN, 2, *args, resume_from="checkpoint-4"), "micro", 0)
    assert resumed and resumed == of(sharded, "micro", 0)[-len(resumed):]
