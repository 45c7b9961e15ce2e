"""The peer's ``accelerate.utils.bnb`` path: names only; the code lives in `hasten.big_modeling` (bnb*.py).

`load_and_quantize_model` quantizes with bitsandbytes (on a GPU, or on the CPU with bitsandbytes' CPU backend);
the helpers that convert layers, plan device maps and offload 8-bit weights are Accelerate's names too.

Example:
    >>> import torch
    >>> from hasten.utils.bnb import has_4bit_bnb_layers
    >>> has_4bit_bnb_layers(torch.nn.Linear(2, 2))
    False
"""

from ..big_modeling.bnb import (
    BnbQuantizationConfig,
    get_keys_to_not_convert,
    get_parameter_device,
    has_4bit_bnb_layers,
    replace_with_bnb_layers,
)
from ..big_modeling.bnb_loading import get_quantized_model_device_map, load_and_quantize_model
from ..big_modeling.bnb_checkpoint import quantize_and_offload_8bit

__all__ = ["BnbQuantizationConfig", "get_keys_to_not_convert", "get_parameter_device", "get_quantized_model_device_map",
           "has_4bit_bnb_layers", "load_and_quantize_model", "quantize_and_offload_8bit", "replace_with_bnb_layers"]
