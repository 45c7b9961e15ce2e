"""Accelerate's bitsandbytes names, the model side: `BnbQuantizationConfig`, which modules to convert, converting them.

`replace_with_bnb_layers` swaps a model's `nn.Linear` layers for
bitsandbytes' `Linear8bitLt` / `Linear4bit` (weights still unquantized:
bitsandbytes quantizes them when they are placed on a device), skipping the
modules Accelerate's rules keep in full precision (`get_keys_to_not_convert`:
tied weights and the output head). Loading and quantizing a whole model is
`bnb_loading.py`; placing data into a quantized parameter, `bnb_params.py`.
bitsandbytes is imported only by the functions that build its layers.

Example:
    >>> config = BnbQuantizationConfig(load_in_8bit=True)
    >>> config.torch_dtype, config.target_dtype
    (torch.float16, torch.int8)
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..options.enums import CustomDtype
from .sizes import find_tied_parameters

__all__ = ["BnbQuantizationConfig", "bitsandbytes", "get_keys_to_not_convert", "get_parameter_device",
           "has_4bit_bnb_layers", "replace_with_bnb_layers"]

logger = logging.getLogger(__name__)

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
    `load_and_quantize_model` quantizes a model by it.

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


def bitsandbytes() -> Any:
    """The bitsandbytes module, imported on first use (it initialises devices when imported), or an install hint.

    Example:
        >>> bitsandbytes().nn.Linear8bitLt.__name__
        'Linear8bitLt'
    """
    try:
        import bitsandbytes as bnb
    except ImportError:
        raise ImportError("quantizing with a BnbQuantizationConfig needs bitsandbytes; install it with "
                          "pip install bitsandbytes (its CPU backend quantizes without a GPU).") from None
    return bnb


def replace_with_bnb_layers(model: nn.Module, bnb_quantization_config: BnbQuantizationConfig,
                            modules_to_not_convert: list[str] | None = None,
                            current_key_name: list[str] | None = None) -> nn.Module:
    """Replace the `nn.Linear` layers of `model` (in place) by bitsandbytes' 8-bit or 4-bit layers; returns `model`.

    A layer is kept when its own name is in `modules_to_not_convert`, or
    when an entry names it or an ancestor, compared as Accelerate does: the
    entry equals the layer's dotted path, or occurs in it followed by a dot
    (``"lm_head"`` keeps ``lm_head``; ``"attn"`` keeps ``layers.0.attn.q``).
    The new layer takes the old one's weight and bias as they are (bitsandbytes
    quantizes them when they are placed on a device) and requires no
    gradient. 8-bit layers get ``llm_int8_threshold``, 4-bit ones the compute
    dtype, quant type and double quantization of the config. A model
    without any Linear layer is logged, as Accelerate does.

    Example:
        >>> config = BnbQuantizationConfig(load_in_8bit=True)
        >>> model = replace_with_bnb_layers(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)), config,
        ...                                 modules_to_not_convert=["1"])
        >>> [type(layer).__name__ for layer in model]
        ['Linear8bitLt', 'Linear']
    """
    replaced = _replace(model, bnb_quantization_config, list(modules_to_not_convert or []), list(current_key_name or []))
    if not replaced:
        logger.warning("no nn.Linear layer of this model was replaced by a bitsandbytes layer (some architectures, e.g. "
                       "GPT-2's Conv1D, use other layers); check the model, or the modules left unconverted.")
    return model


def _kept(path: str, modules_to_not_convert: list[str]) -> bool:
    """Accelerate's rule: an entry equal to the layer's path, or found in it followed by a dot, keeps the layer."""
    return any(key == path or (key in path and key + "." in path) for key in modules_to_not_convert)


def _replace(model: nn.Module, config: BnbQuantizationConfig, keep: list[str], path: list[str]) -> bool:
    replaced = False
    for name, module in model.named_children():
        path.append(name)
        if isinstance(module, nn.Linear) and name not in keep and not _kept(".".join(path), keep):
            setattr(model, name, _bnb_layer(module, config))
            replaced = True
        if next(module.children(), None) is not None:  # (the original module's children, as Accelerate walks them)
            replaced = _replace(module, config, keep, path) or replaced
        path.pop()
    return replaced


def _bnb_layer(linear: nn.Linear, config: BnbQuantizationConfig) -> nn.Module:
    """The bitsandbytes layer standing for `linear`, holding its (still unquantized) weight and bias."""
    bnb = bitsandbytes()
    bias = linear.bias is not None
    layer: nn.Module
    if config.load_in_8bit:
        layer = bnb.nn.Linear8bitLt(linear.in_features, linear.out_features, bias, has_fp16_weights=False,
                                    threshold=config.llm_int8_threshold)
    else:
        layer = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias, config.bnb_4bit_compute_dtype,
                                  compress_statistics=config.bnb_4bit_use_double_quant,
                                  quant_type=config.bnb_4bit_quant_type)
    layer.weight.data = linear.weight.data
    if bias:
        layer.bias.data = linear.bias.data
    return layer.requires_grad_(False)
