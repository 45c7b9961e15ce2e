"""bitsandbytes 8-bit / 4-bit loading on the CPU (bitsandbytes' CPU backend), end to end and against Accelerate.

Accelerate's `load_and_quantize_model` needs a GPU; `tests/scripts/bnb_peer.py` runs its own code on the
CPU by letting the CPU stand for the current GPU, and the quantized weights, scales and outputs must equal
hasten's bit for bit. hasten's other paths (a model on meta loaded from safetensors, 8-bit weights offloaded
to disk and back, a checkpoint holding int8 weights with their scales) must give the same weights again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("bitsandbytes")

from hasten.big_modeling import init_empty_weights  # noqa: E402
from hasten.big_modeling.bnb_checkpoint import ScalePairing  # noqa: E402
from hasten.big_modeling.sizes import set_module_tensor_to_device  # noqa: E402
from hasten.checkpointing.model_files import write_model_files  # noqa: E402
from hasten.utils import BnbQuantizationConfig, load_and_quantize_model  # noqa: E402
from hasten.utils.bnb import get_quantized_model_device_map, replace_with_bnb_layers  # noqa: E402

SCRIPT = Path(__file__).parent / "scripts" / "bnb_peer.py"
IDS = torch.arange(8).reshape(2, 4)
EIGHT = dict(load_in_8bit=True, torch_dtype="fp32", keep_in_fp32_modules=["attn"])
FOUR = dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype="fp32", bnb_4bit_use_double_quant=True)
OFFLOADED = {"embed": "cpu", "blocks": "disk", "attn": "cpu", "norm": "cpu", "head": "cpu"}


sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from bnb_net import Net, net as _net  # noqa: E402  (the model bnb_peer.py quantizes under both libraries)


def _empty() -> Net:
    with init_empty_weights():
        return Net()


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("weights")
    write_model_files(_net().state_dict(), folder)
    assert list(folder.glob("*.safetensors"))
    return folder


def _loaded(kwargs: dict) -> nn.Module:
    """The loaded-model path (the one Accelerate's comparison runs)."""
    return load_and_quantize_model(_net(), BnbQuantizationConfig(**kwargs))


def _same_state(one: nn.Module, other: nn.Module) -> None:
    mine, theirs = one.state_dict(), other.state_dict()
    assert mine.keys() == theirs.keys()
    for key in mine:
        assert torch.equal(mine[key], theirs[key]), key


def _relative_error(model: nn.Module) -> float:
    reference = _net()(IDS)
    with torch.no_grad():
        return float((model(IDS) - reference).norm() / reference.norm())


# -- against Accelerate ----------------------------------------------------------------------------------------------
@pytest.mark.parity
@pytest.mark.timeout(300)
def test_quantized_weights_scales_and_outputs_equal_accelerates(tmp_path):
    from conftest import run_with_timeout

    pytest.importorskip("accelerate")
    runs = {}
    for library in ("hasten", "accelerate"):
        out = tmp_path / f"{library}.pt"
        result = run_with_timeout([sys.executable, str(SCRIPT), library, str(out)], 240, leftovers_fail=library == "hasten")
        assert result.returncode == 0, f"{library}:\n{result.stdout}\n{result.stderr[-3000:]}"
        runs[library] = torch.load(out, weights_only=False)
    ours, theirs = runs["hasten"], runs["accelerate"]
    for name, reference in theirs["load"].items():
        mine = ours["load"][name]
        for key in ("classes", "dtypes", "flags"):
            assert mine[key] == reference[key], (name, key)
        assert sorted(mine["skip_modules"]) == sorted(reference["skip_modules"])  # Accelerate's order comes from a set
        assert mine["state"].keys() == reference["state"].keys(), name
        for key, tensor in reference["state"].items():  # int8 rows, scales, packed 4-bit weights and statistics
            assert torch.equal(mine["state"][key], tensor), (name, key)
        if "out" in reference:
            assert torch.equal(mine["out"], reference["out"]), name
    assert theirs["load"]["8bit"]["classes"]["blocks.0"] == "Linear8bitLt"  # the reference really quantized
    assert ours["converted"] == theirs["converted"]  # replace_with_bnb_layers' substring rule
    for key, reference in theirs["maps"].items():
        if key in ("4bit_nf4:sequential", "4bit_nf4:auto"):
            # Accelerate refuses 4-bit modules on "cpu" (to it an offload); without a GPU, hasten runs them there
            assert reference == "ValueError" and ours["maps"][key] == {"": "cpu"}
        else:
            assert ours["maps"][key] == (dict(reference) if isinstance(reference, dict) else reference), key


# -- loading from a checkpoint (a model on meta) -------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [EIGHT, FOUR], ids=["8bit", "4bit"])
def test_a_model_on_meta_loads_quantized_as_the_loaded_path_quantizes(weights, kwargs):
    model = load_and_quantize_model(_empty(), BnbQuantizationConfig(**kwargs), weights_location=weights)
    _same_state(model, _loaded(kwargs))
    expected = "Linear8bitLt" if "load_in_8bit" in kwargs else "Linear4bit"
    assert [type(m).__name__ for m in (model.blocks[0], model.blocks[2], model.attn.q, model.head)] == \
        [expected, expected] + (["Linear", "Linear"] if expected == "Linear8bitLt" else [expected, "Linear"])
    assert model.head.weight is model.embed.weight  # the tied head stays whole, and tied
    assert _relative_error(model) < (0.02 if expected == "Linear8bitLt" else 0.3)
    assert model.is_loaded_in_8bit == (expected == "Linear8bitLt")


def test_dtypes_follow_torch_dtype_and_keep_in_fp32_modules(weights):
    config = BnbQuantizationConfig(load_in_8bit=True, keep_in_fp32_modules=["attn"])  # torch_dtype: float16
    model = load_and_quantize_model(_empty(), config, weights_location=weights)
    assert model.blocks[0].weight.dtype == torch.int8 and model.blocks[0].bias.dtype == torch.float16
    assert model.embed.weight.dtype == model.norm.weight.dtype == torch.float16
    assert model.attn.q.weight.dtype == torch.float32
    assert config.skip_modules == ["embed", "head", "head", "attn"]  # filled in as Accelerate fills it


def test_skip_modules_stay_unquantized(weights):
    model = load_and_quantize_model(_empty(), BnbQuantizationConfig(**{**EIGHT, "skip_modules": ["blocks.2"]}),
                                    weights_location=weights)
    assert type(model.blocks[0]).__name__ == "Linear8bitLt" and type(model.blocks[2]).__name__ == "Linear"
    assert type(model.attn.q).__name__ == "Linear"  # keep_in_fp32_modules join the skipped ones


# -- 8-bit weights on disk ----------------------------------------------------------------------------------------
def test_8bit_weights_offloaded_to_disk_are_written_quantized_and_come_back_for_the_forward(weights, tmp_path):
    folder = tmp_path / "offload"
    model = load_and_quantize_model(_empty(), BnbQuantizationConfig(**EIGHT), weights_location=weights,
                                    device_map=OFFLOADED, offload_folder=folder)
    index = json.loads((folder / "index.json").read_text())
    assert index["blocks.0.weight"]["dtype"] == "int8" and index["blocks.0.SCB"]["dtype"] == "float32"
    assert model.blocks[0].weight.device == torch.device("meta")
    in_memory = load_and_quantize_model(_empty(), BnbQuantizationConfig(**EIGHT), weights_location=weights)
    reference = in_memory.blocks[0].state_dict()
    from hasten.big_modeling.offload import load_offloaded_weight

    assert torch.equal(load_offloaded_weight(folder / "blocks.0.weight.dat", index["blocks.0.weight"]), reference["weight"])
    assert torch.equal(load_offloaded_weight(folder / "blocks.0.SCB.dat", index["blocks.0.SCB"]), reference["SCB"])
    with torch.no_grad():
        assert torch.equal(model(IDS), in_memory(IDS))
    assert model.blocks[0].weight.device == torch.device("meta")  # back off the device after the forward


def test_offload_state_dict_parks_8bit_weights_with_their_scales(weights):
    model = load_and_quantize_model(_empty(), BnbQuantizationConfig(**EIGHT), weights_location=weights,
                                    device_map={"": "cpu"}, offload_state_dict=True)
    _same_state(model, load_and_quantize_model(_empty(), BnbQuantizationConfig(**EIGHT), weights_location=weights))


def test_a_checkpoint_of_int8_weights_loads_with_their_scales(weights, tmp_path):
    from safetensors.torch import save_file

    quantized = load_and_quantize_model(_empty(), BnbQuantizationConfig(**EIGHT), weights_location=weights)
    state = {k: v.contiguous() for k, v in quantized.state_dict().items() if k != "head.weight"}  # tied: saved once
    assert state["blocks.0.weight"].dtype == torch.int8 and "blocks.0.SCB" in state
    save_file(state, tmp_path / "model.safetensors")
    again = load_and_quantize_model(_empty(), BnbQuantizationConfig(**EIGHT), weights_location=tmp_path)
    _same_state(again, quantized)
    with torch.no_grad():
        assert torch.equal(again(IDS), quantized(IDS))


def test_scales_find_their_weight_whichever_comes_first():
    model = replace_with_bnb_layers(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)),
                                    BnbQuantizationConfig(load_in_8bit=True))
    weight, scales = torch.ones(4, 4, dtype=torch.int8), torch.full((4,), 2.0)
    stream = [("f", "0.SCB", scales), ("f", "0.weight", weight), ("f", "1.weight", weight), ("f", "1.SCB", scales),
              ("f", "0.bias", torch.zeros(4))]
    placed = [(name, scale is not None) for _, name, _, scale in ScalePairing(model).stream(stream)]
    assert placed == [("0.weight", True), ("1.weight", True), ("0.bias", False)]
    lonely = [(name, scale) for _, name, _, scale in ScalePairing(model).stream([("f", "1.weight", weight)])]
    assert lonely == [("1.weight", None)]  # no scales in the file: placed without, as Accelerate does


def test_set_module_tensor_to_device_takes_8bit_statistics():
    quantized = load_and_quantize_model(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)),
                                        BnbQuantizationConfig(load_in_8bit=True, torch_dtype="fp32"))
    with init_empty_weights():  # as load_and_quantize_model converts a model on meta
        layer = replace_with_bnb_layers(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)),
                                        BnbQuantizationConfig(load_in_8bit=True))[0]
    set_module_tensor_to_device(layer, "weight", "cpu", value=quantized[0].weight.data,
                                fp16_statistics=quantized[0].weight.SCB)
    set_module_tensor_to_device(layer, "bias", "cpu", value=quantized[0].bias.data)
    assert layer.weight.dtype == torch.int8 and torch.equal(layer.weight.SCB, quantized[0].weight.SCB)
    assert torch.equal(layer.weight.data, quantized[0].weight.data)  # kept as given, not quantized again
    x = torch.randn(3, 8)
    assert torch.equal(layer(x), quantized[0](x))


# -- refusals and defaults -----------------------------------------------------------------------------------------
def test_without_a_gpu_the_default_map_is_the_cpu_and_4bit_may_run_there():
    config = BnbQuantizationConfig(load_in_4bit=True, skip_modules=[], keep_in_fp32_modules=[])
    assert get_quantized_model_device_map(nn.Linear(2, 2), config) == {"": "cpu"}  # Accelerate: "No GPU found"
    assert get_quantized_model_device_map(nn.Linear(2, 2), config, {"": "cpu"}) == {"": "cpu"}
    with pytest.raises(ValueError, match="offloads 4-bit modules to disk"):
        get_quantized_model_device_map(nn.Linear(2, 2), config, {"": "disk"})
    with pytest.raises(ValueError, match="is not a strategy"):
        get_quantized_model_device_map(nn.Linear(2, 2), config, "everywhere")


def test_bad_calls_say_what_to_do():
    with pytest.raises(TypeError, match="BnbQuantizationConfig"):
        load_and_quantize_model(nn.Linear(2, 2), {"load_in_8bit": True})
    with pytest.raises(ValueError, match="pass weights_location"):
        load_and_quantize_model(_empty(), BnbQuantizationConfig(load_in_8bit=True))


def test_without_bitsandbytes_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    with pytest.raises(ImportError, match="pip install bitsandbytes"):
        load_and_quantize_model(_net(), BnbQuantizationConfig(load_in_8bit=True))
