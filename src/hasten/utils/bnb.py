"""The peer's ``accelerate.utils.bnb`` path: names only; the code lives in `hasten.big_modeling.bnb`.

hasten does not quantize models itself: the functions that would (e.g. `load_and_quantize_model`) refuse in
one sentence; the ones that only inspect a model work as Accelerate's.

Example:
    >>> import torch
    >>> from hasten.utils.bnb import has_4bit_bnb_layers
    >>> has_4bit_bnb_layers(torch.nn.Linear(2, 2))
    False
"""

from ..big_modeling.bnb import (
    get_keys_to_not_convert,
    get_parameter_device,
    get_quantized_model_device_map,
    has_4bit_bnb_layers,
    load_and_quantize_model,
    quantize_and_offload_8bit,
    replace_with_bnb_layers,
)

__all__ = ["get_keys_to_not_convert", "get_parameter_device", "get_quantized_model_device_map", "has_4bit_bnb_layers",
           "load_and_quantize_model", "quantize_and_offload_8bit", "replace_with_bnb_layers"]
