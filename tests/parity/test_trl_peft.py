"""TRL's SFTTrainer and a PEFT LoRA fine-tune run on hasten through the accelerate switch, step for step as on Accelerate.

The clients (``scripts/sft_client.py``, ``scripts/peft_client.py``) never
import accelerate: TRL, PEFT and transformers do. Each is run as a user would,
under Accelerate (``python`` / ``accelerate launch --multi_gpu``) and under
hasten (``hasten launch --as-accelerate``), and every rank's records must be
the same bit for bit: the rows of each micro-batch, its loss (``float.hex``),
the learning rate of each optimizer step and what Trainer logs. The LoRA run
also saves its adapter, which must load back (``PeftModel.from_pretrained``)
with the trained weights and be the same file's tensors under both libraries.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import sys
from pathlib import Path

import pytest

from conftest import run_with_timeout

from .harness import peer_entry, restore_cached, store_cached

pytestmark = [pytest.mark.parity, pytest.mark.timeout(900)]

SCRIPTS = Path(__file__).parent / "scripts"
# A few times what a run needs here (8-20 s); a hang costs one run's limit and leaves no process behind.
RUN_TIMEOUT = 150
# Trainer's wall-clock figures differ between any two runs.
TIMINGS = {"train_runtime", "train_samples_per_second", "train_steps_per_second"}


def command(lib: str, script: str, nproc: int, out: Path) -> list[str]:
    several = ["--num_processes", str(nproc)] if nproc > 1 else []
    if lib == "hasten":
        launcher = ["-m", "hasten", "launch", "--as-accelerate", *several]
    else:
        launcher = ["-m", "accelerate.commands.launch", "--multi_gpu", *several] if nproc > 1 else []
    return [sys.executable, *launcher, str(SCRIPTS / script), "--out", str(out)]


def run(lib: str, script: str, nproc: int, out: Path) -> dict[int, list[dict]]:
    """Run ``script`` under ``lib`` on ``nproc`` processes; every rank's records, checked complete."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1", "WANDB_DISABLED": "true"}
    env.pop("HASTEN_AS_ACCELERATE", None)  # the peer runs the real accelerate; hasten's launcher sets it itself
    env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                        if p and not p.rstrip("/").endswith("_accelerate_site"))
    # Accelerate's runs are cached as the harness caches its peer runs (keyed by the script, the processes and the
    # versions, here TRL's, PEFT's and transformers' too): only hasten's side is run again
    entry = peer_entry(SCRIPTS / script, nproc, [md.version(name) for name in ("trl", "peft", "transformers")]) \
        if lib == "accelerate" else None
    cached = restore_cached(entry, out)
    if not cached:
        result = run_with_timeout(command(lib, script, nproc, out), RUN_TIMEOUT, env, leftovers_fail=lib == "hasten")
        assert result.returncode == 0, f"{lib} {script} on {nproc} exited {result.returncode}:\n{result.stderr[-6000:]}"
    records = {int(path.stem.removeprefix("records_rank")): [json.loads(line) for line in path.read_text().splitlines()]
               for path in out.glob("records_rank*.jsonl")}
    assert sorted(records) == list(range(nproc)), f"ranks that wrote records: {sorted(records)}"
    for rank, rank_records in records.items():
        last = rank_records[-1]
        assert last["k"] == "done", f"{lib} rank {rank} stopped early: {rank_records[-3:]}"
        assert (last["world"], last["accelerate"]) == (nproc, f"{lib if lib == 'hasten' else 'accelerate'}.accelerator")
    if not cached:  # a complete run only
        store_cached(entry, out)
    return records


def comparable(records: list[dict]) -> list[dict]:
    return [{key: value for key, value in record.items() if key not in TIMINGS} for record in records]


def assert_same_steps(peer: dict[int, list[dict]], hasten: dict[int, list[dict]], micro_batches: int) -> None:
    """Same records on every rank, bit for bit, with ``micro_batches`` training micro-batches each."""
    for rank in peer:
        micro = [r for r in peer[rank] if r["k"] == "micro"]
        assert len(micro) == micro_batches, f"rank {rank}: {len(micro)} micro-batches, expected {micro_batches}"
        for kind in ("micro", "step", "log"):
            ours = [r for r in comparable(hasten[rank]) if r["k"] == kind]
            theirs = [r for r in comparable(peer[rank]) if r["k"] == kind]
            first = next((pair for pair in zip(theirs, ours) if pair[0] != pair[1]), (len(theirs), len(ours)))
            assert ours == theirs, f"rank {rank}: {kind} records differ, first (Accelerate, hasten): {first}"
    # Each of the 2 epochs, the ranks together trained on each of the 32 rows once.
    half = micro_batches // 2
    for epoch in (0, 1):
        rows = []
        for rank_records in hasten.values():
            micro = [r for r in rank_records if r["k"] == "micro"][epoch * half:(epoch + 1) * half]
            rows += [row for r in micro for row in r["rows"]]
        assert sorted(rows) == list(range(32)), f"epoch {epoch}: rows {sorted(rows)}"


@pytest.mark.parametrize("nproc", [1, pytest.param(2, marks=pytest.mark.multiprocess)])
def test_sft_trainer_same_losses_as_on_accelerate(tmp_path: Path, nproc: int) -> None:
    peer = run("accelerate", "sft_client.py", nproc, tmp_path / "accelerate")
    hasten = run("hasten", "sft_client.py", nproc, tmp_path / "hasten")
    # 32 rows, 4 a micro-batch, 2 epochs; SFTConfig's default bf16 autocast over TRL's own forward
    assert_same_steps(peer, hasten, micro_batches=16 // nproc)
    assert hasten[0][-1]["wrapped"] == ("DistributedDataParallel" if nproc > 1 else "LlamaForCausalLM")


@pytest.mark.multiprocess
def test_peft_lora_same_losses_as_on_accelerate_and_the_adapter_loads_back(tmp_path: Path) -> None:
    safetensors = pytest.importorskip("safetensors.torch")
    peer = run("accelerate", "peft_client.py", 2, tmp_path / "accelerate")
    hasten = run("hasten", "peft_client.py", 2, tmp_path / "hasten")
    assert_same_steps(peer, hasten, micro_batches=8)  # 2 epochs of 16 rows a rank, 4 a micro-batch
    adapter = {lib: next(r for r in records[0] if r["k"] == "adapter") for lib, records in
               (("accelerate", peer), ("hasten", hasten))}
    mine = adapter["hasten"]
    assert "adapter_model.safetensors" in mine["files"] and mine["lora"] == 8
    assert mine["same_keys"] and mine["max_abs_diff"] == 0.0 and mine["logits_max_abs_diff"] == 0.0
    assert mine["lora_sums"] == adapter["accelerate"]["lora_sums"]
    files = {lib: safetensors.load_file(tmp_path / lib / "adapter" / "adapter_model.safetensors")
             for lib in ("accelerate", "hasten")}
    assert sorted(files["hasten"]) == sorted(files["accelerate"])
    assert all(files["hasten"][name].equal(files["accelerate"][name]) for name in files["hasten"])
