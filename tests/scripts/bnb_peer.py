"""bitsandbytes quantization under hasten or under Accelerate itself, on the CPU; the results for comparison.

Usage: bnb_peer.py LIBRARY OUT_FILE   (LIBRARY: hasten | accelerate; writes a torch file of plain values and tensors)

Accelerate's `load_and_quantize_model` needs a GPU: for a loaded model it moves the model to
`torch.cuda.current_device()`. Under Accelerate this script says the CPU is that device (torch.cuda.is_available
-> True, current_device -> "cpu", after bitsandbytes is imported), so Accelerate's own code converts, casts and
moves the model, and bitsandbytes' CPU backend quantizes it, as it does under hasten. Recorded per scenario: the
class of every module, every parameter's dtype, the quantized model's state dict (int8 rows and their scales,
packed 4-bit weights and their statistics) and the output for fixed inputs; plus which layers
`replace_with_bnb_layers` converts for several `modules_to_not_convert`, and the maps (or the error)
`get_quantized_model_device_map` gives.
"""

import contextlib
import sys
from unittest import mock

import bitsandbytes  # noqa: F401  (imported before torch.cuda is patched: it reads CUDA's state when imported)
import torch
from torch import nn

LIBRARY, OUT = sys.argv[1], sys.argv[2]
if LIBRARY == "accelerate":
    from accelerate.utils import BnbQuantizationConfig, load_and_quantize_model
    from accelerate.utils.bnb import get_quantized_model_device_map, replace_with_bnb_layers
else:
    from hasten.utils import BnbQuantizationConfig, load_and_quantize_model
    from hasten.utils.bnb import get_quantized_model_device_map, replace_with_bnb_layers


from bnb_net import net  # noqa: E402  (beside this script)


IDS = torch.arange(8).reshape(2, 4)
SCENARIOS = {
    "8bit": dict(load_in_8bit=True, torch_dtype="fp32", keep_in_fp32_modules=["attn"]),
    "8bit_fp16": dict(load_in_8bit=True, keep_in_fp32_modules=["attn"]),
    "8bit_skip": dict(load_in_8bit=True, torch_dtype="fp32", skip_modules=["blocks.2"], llm_int8_threshold=2.0),
    "4bit_nf4": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype="fp32",
                     bnb_4bit_use_double_quant=True),
    "4bit_fp4": dict(load_in_4bit=True, bnb_4bit_compute_dtype="fp32"),
}


def as_accelerate_on_cpu():
    """Under Accelerate: the CPU stands for the current GPU its loaded-model path moves to."""
    if LIBRARY != "accelerate":
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch("torch.cuda.is_available", return_value=True))
    stack.enter_context(mock.patch("torch.cuda.current_device", return_value="cpu"))
    return stack


def quantized(kwargs: dict) -> dict:
    config = BnbQuantizationConfig(**kwargs)
    with as_accelerate_on_cpu():
        model = load_and_quantize_model(net(), config)
    record = {"classes": {n: type(m).__name__ for n, m in model.named_modules() if n},
              "dtypes": {n: str(p.dtype) for n, p in model.named_parameters(remove_duplicate=False)},
              "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
              "skip_modules": list(config.skip_modules), "flags": (model.is_loaded_in_8bit, model.is_loaded_in_4bit)}
    if str(config.torch_dtype) == "torch.float32":
        with torch.no_grad():
            record["out"] = model(IDS)
    return record


class Named(nn.Module):
    """Names that show Accelerate's substring rule for modules_to_not_convert."""

    def __init__(self) -> None:
        super().__init__()
        self.h = nn.ModuleList(nn.Linear(8, 8) for _ in range(12))
        self.xh = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.out = nn.Linear(8, 2)


def converted(keep: list) -> list:
    model = replace_with_bnb_layers(Named(), BnbQuantizationConfig(load_in_8bit=True), modules_to_not_convert=keep)
    return sorted(n for n, m in model.named_modules() if type(m).__name__ == "Linear8bitLt")


def device_map(kwargs: dict, given) -> object:
    config = BnbQuantizationConfig(**kwargs)
    config.skip_modules = ["head"] if config.skip_modules is None else config.skip_modules
    config.keep_in_fp32_modules = config.keep_in_fp32_modules or []
    try:
        return get_quantized_model_device_map(net(), config, given, max_memory={"cpu": 20_000})
    except Exception as error:  # the error's kind is compared
        return type(error).__name__


def main() -> None:
    results = {"load": {name: quantized(kwargs) for name, kwargs in SCENARIOS.items()},
               "converted": {repr(keep): converted(keep) for keep in (["h.1"], ["1"], ["h"], ["0"], ["out"], [])}}
    maps = {}
    for name in ("8bit", "4bit_nf4"):
        for given in ({"embed": "cpu", "blocks": "disk", "attn": "cpu", "norm": "cpu", "head": "cpu"},
                      {"blocks": 0, "embed": "disk", "attn": 0, "norm": 0, "head": 0}, "sequential", "auto", "wrong"):
            maps[f"{name}:{given}"] = device_map(SCENARIOS[name], given)
    results["maps"] = maps
    torch.save(results, OUT)


if __name__ == "__main__":
    main()
