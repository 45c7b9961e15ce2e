"""Accelerate's bitsandbytes names (``accelerate.utils.bnb`` and its `BnbQuantizationConfig`).

hasten does not quantize models itself: `load_and_quantize_model` and the
functions that replace or offload quantized layers refuse in one sentence
(load the model quantized with transformers' ``BitsAndBytesConfig``
instead; `prepare` trains such models, see `quantized.py`). The config
object, and the helpers that only look at a model, work as Accelerate's.

Example:
    >>> config = BnbQuantizationConfig(load_in_8bit=True)
    >>> config.torch_dtype, config.target_dtype
    (torch.float16, torch.int8)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..core.unavailable import refused_function
from ..options.enums import CustomDtype
from .sizes import find_tied_parameters

__all__ = ["BnbQuantizationConfig", "get_keys_to_not_convert", "get_parameter_device", "has_4bit_bnb_layers",
           "load_and_quantize_model", "get_quantized_model_device_map", "replace_with_bnb_layers",
           "quantize_and_offload_8bit"]

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _dtype(value: Any, name: str) -> Any:
    if isinstance(value, str):
        if value not in _DTYPES:
            raise ValueError(f"{name} must be in ['fp32','fp16','bf16'] but found {value}")
        return _DTYPES[value]
    return value


@dataclass
class BnbQuantizationConfig:
    """How bitsandbytes would quantize a model: 8-bit (`load_in_8bit`) or 4-bit (`load_in_4bit`), exactly one.

    Checked as Accelerate checks it; "fp32"/"fp16"/"bf16" strings become
    torch dtypes, `torch_dtype` defaults to fp16 (8-bit) or the 4-bit compute
    dtype, and `target_dtype` is ``torch.int8`` or ``CustomDtype.INT4``.
    hasten itself quantizes nothing with it (see the module's docstring).

    Example:
        >>> BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype="bf16").torch_dtype
        torch.bfloat16
        >>> BnbQuantizationConfig()
        Traceback (most recent call last):
        ...
        ValueError: load_in_4bit and load_in_8bit can't be both False
    """

    load_in_8bit: bool = False
    llm_int8_threshold: float = 6.0
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = "fp4"
    bnb_4bit_use_double_quant: bool = False
    bnb_4bit_compute_dtype: Any = "fp16"
    torch_dtype: Any = None
    skip_modules: list[str] | None = None
    keep_in_fp32_modules: list[str] | None = None

    def __post_init__(self) -> None:
        # Accelerate's checks and its words (libraries match them).
        for flag in ("load_in_8bit", "load_in_4bit", "bnb_4bit_use_double_quant"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be a boolean")
        if self.load_in_4bit and self.load_in_8bit:
            raise ValueError("load_in_4bit and load_in_8bit can't be both True")
        if not self.load_in_4bit and not self.load_in_8bit:
            raise ValueError("load_in_4bit and load_in_8bit can't be both False")
        if not isinstance(self.llm_int8_threshold, (int, float)):
            raise ValueError("llm_int8_threshold must be a float or an int")
        if not isinstance(self.bnb_4bit_quant_type, str):
            raise ValueError("bnb_4bit_quant_type must be a string")
        if self.bnb_4bit_quant_type not in ("fp4", "nf4"):
            raise ValueError(f"bnb_4bit_quant_type must be in ['fp4','nf4'] but found {self.bnb_4bit_quant_type}")
        self.bnb_4bit_compute_dtype = _dtype(self.bnb_4bit_compute_dtype, "bnb_4bit_compute_dtype")
        if not isinstance(self.bnb_4bit_compute_dtype, torch.dtype):
            raise ValueError("bnb_4bit_compute_dtype must be a string or a torch.dtype")
        for names in ("skip_modules", "keep_in_fp32_modules"):
            if getattr(self, names) is not None and not isinstance(getattr(self, names), list):
                raise ValueError(f"{names} must be a list of strings")
        self.target_dtype: Any = CustomDtype.INT4 if self.load_in_4bit else torch.int8
        if self.load_in_4bit and self.llm_int8_threshold != 6.0:
            warnings.warn("llm_int8_threshold can only be used for model loaded in 8bit")
        self.torch_dtype = _dtype(self.torch_dtype, "torch_dtype")
        if self.torch_dtype is None:
            self.torch_dtype = torch.float16 if self.load_in_8bit else self.bnb_4bit_compute_dtype
        if not isinstance(self.torch_dtype, torch.dtype):
            raise ValueError("torch_dtype must be a torch.dtype")


def get_keys_to_not_convert(model: nn.Module) -> list[str]:
    """Module names to keep in full precision when quantizing: tied weights' modules and the output head.

    A base model (one without its head: it lacks the attribute its
    `base_model_prefix` names) and without tied weights gives [].

    Example:
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
        >>> get_keys_to_not_convert(model)
        ['1']
    """
    tied = [name for group in find_tied_parameters(model) for name in group]
    prefix = getattr(model, "base_model_prefix", None)
    is_base_model = prefix is not None and not hasattr(model, prefix)
    if not tied and is_base_model:
        return []
    children = [name for name, _ in model.named_children()]
    last = [children[-1]] if children else []
    keys = list(dict.fromkeys(tied)) + [name for name in last if name not in tied]
    return [key.replace(".weight", "").replace(".bias", "") for key in keys]


def get_parameter_device(parameter: nn.Module) -> torch.device:
    """The device of the module's first parameter.

    Example:
        >>> get_parameter_device(nn.Linear(2, 2))
        device(type='cpu')
    """
    return next(parameter.parameters()).device


def has_4bit_bnb_layers(model: nn.Module) -> bool:
    """True when `model` holds a bitsandbytes 4-bit linear layer (found by class; bitsandbytes is not imported).

    Example:
        >>> has_4bit_bnb_layers(nn.Linear(2, 2))
        False
    """
    return any(any(cls.__name__ == "Linear4bit" and cls.__module__.startswith("bitsandbytes")
                   for cls in type(module).__mro__) for module in model.modules())


_REFUSED = ("needs bitsandbytes quantization, which hasten does not do itself; load the model quantized with "
            "transformers' BitsAndBytesConfig (from_pretrained(..., quantization_config=...)) and prepare it instead.")
_HERE = "hasten.utils.bnb"
load_and_quantize_model = refused_function(
    "load_and_quantize_model", _REFUSED, _HERE, "model", "bnb_quantization_config", weights_location=None,
    device_map=None, no_split_module_classes=None, max_memory=None, offload_folder=None, offload_state_dict=False)
get_quantized_model_device_map = refused_function(
    "get_quantized_model_device_map", _REFUSED, _HERE, "model", "bnb_quantization_config", device_map=None,
    max_memory=None, no_split_module_classes=None)
replace_with_bnb_layers = refused_function("replace_with_bnb_layers", _REFUSED, _HERE, "model",
                                           "bnb_quantization_config", modules_to_not_convert=None,
                                           current_key_name=None)
quantize_and_offload_8bit = refused_function("quantize_and_offload_8bit", _REFUSED, _HERE, "model", "param",
                                             "param_name", "new_dtype", "offload_folder", "offload_index",
                                             "fp16_statistics")
