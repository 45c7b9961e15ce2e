"""`load_and_quantize_model`: a model quantized to 8 or 4 bits by bitsandbytes, as Accelerate's builds it.

Two ways in, as in Accelerate:

- a model built on ``meta`` (under `init_empty_weights`) and a checkpoint:
  its Linear layers become bitsandbytes layers, the weights are read one
  tensor at a time and quantized as they are placed by the device map
  (`get_quantized_model_device_map`), 8-bit weights bound for disk are
  written quantized with their scales, and the model is dispatched;
- a model already loaded: its layers are replaced, its weights cast to
  ``torch_dtype`` (``keep_in_fp32_modules`` to float32) and quantized by
  moving the model to the quantizing device.

Which modules stay in full precision follows Accelerate: ``skip_modules``
(default `get_keys_to_not_convert`: tied weights and the output head), plus
``keep_in_fp32_modules``, plus, for 4 bits, the modules a custom device map
offloads.

Where Accelerate needs a GPU (its default device map, and moving a loaded
model), hasten uses the current GPU too and, on a machine without one, the
CPU, which bitsandbytes' CPU backend quantizes on. There "cpu" in a device
map is where the model runs, not an offload, so 4-bit modules may be mapped
there; "disk" stays an offload.

Example:
    >>> from hasten.big_modeling.bnb import BnbQuantizationConfig
    >>> config = BnbQuantizationConfig(load_in_8bit=True)
    >>> model = load_and_quantize_model(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)), config)
    >>> [type(layer).__name__ for layer in model], model[0].weight.dtype
    (['Linear8bitLt', 'Linear'], torch.int8)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .bnb import BnbQuantizationConfig, bitsandbytes, get_keys_to_not_convert, get_parameter_device, replace_with_bnb_layers
from .bnb_checkpoint import quantize_and_offload_8bit
from .bnb_params import quantizing_device
from .device_map import get_balanced_memory, infer_auto_device_map
from .dispatch import dispatch_model, init_empty_weights
from .loading import load_checkpoint_in_model

__all__ = ["get_quantized_model_device_map", "load_and_quantize_model", "offloading_devices",
           "quantize_and_offload_8bit"]

logger = logging.getLogger(__name__)
_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def offloading_devices() -> tuple[str, ...]:
    """The device-map values that offload a module: "cpu" and "disk" beside a GPU, only "disk" on a CPU-only machine.

    Example:
        >>> "disk" in offloading_devices()
        True
    """
    return ("disk",) if quantizing_device().type == "cpu" else ("cpu", "disk")


def load_and_quantize_model(model: nn.Module, bnb_quantization_config: BnbQuantizationConfig,
                            weights_location: str | os.PathLike[str] | None = None,
                            device_map: Mapping[str, int | str | torch.device] | str | None = None,
                            no_split_module_classes: list[str] | None = None,
                            max_memory: Mapping[int | str, int | str] | None = None,
                            offload_folder: str | os.PathLike[str] | None = None,
                            offload_state_dict: bool = False) -> nn.Module:
    """Quantize `model` with bitsandbytes by `bnb_quantization_config`; load it from `weights_location` if on meta.

    A model on ``meta`` needs `weights_location` (a weights file, an
    ``.index.json`` of shards, or a folder); the weights then go where
    `device_map` (a dict, or "auto" / "balanced" / "balanced_low_0" /
    "sequential" planned from `max_memory` and `no_split_module_classes`;
    default: the quantizing device) puts them, "disk" ones into
    `offload_folder` (8-bit ones quantized, with their scales). A loaded
    model is converted where it is and moved to the quantizing device (its
    GPU, the current GPU, else the CPU); Accelerate warns that loading on
    ``meta`` is better, and so does hasten. Sets ``is_loaded_in_8bit`` /
    ``is_loaded_in_4bit`` on the model, and fills the config's
    ``skip_modules`` / ``keep_in_fp32_modules`` (as Accelerate does).

    Example:
        >>> import tempfile
        >>> from hasten.big_modeling.bnb import BnbQuantizationConfig
        >>> from hasten.checkpointing.model_files import write_model_files
        >>> folder = tempfile.mkdtemp()
        >>> _ = write_model_files(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)).state_dict(), folder)
        >>> with init_empty_weights():
        ...     empty = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
        >>> config = BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype="fp32")
        >>> model = load_and_quantize_model(empty, config, weights_location=folder, device_map={"": "cpu"})
        >>> type(model[0]).__name__, model[0].weight.dtype, model.is_loaded_in_4bit
        ('Linear4bit', torch.uint8, True)
    """
    config = bnb_quantization_config
    if not isinstance(config, BnbQuantizationConfig):
        raise TypeError(f"bnb_quantization_config must be a BnbQuantizationConfig, not {type(config).__name__}; build "
                        "one with BnbQuantizationConfig(load_in_8bit=True) or (load_in_4bit=True).")
    bitsandbytes()  # the install hint, before anything changes
    offloaded = []
    if isinstance(device_map, Mapping) and len(device_map) > 1:
        offloaded = [name for name, device in device_map.items() if device in offloading_devices()]
    if config.skip_modules is None:  # the output head and tied weights stay in full precision
        config.skip_modules = get_keys_to_not_convert(model)
    if config.load_in_4bit:  # 4-bit layers cannot be offloaded: those modules stay unquantized
        config.skip_modules.extend(offloaded)
    if config.keep_in_fp32_modules is None:
        config.keep_in_fp32_modules = []
    not_converted = config.skip_modules  # (Accelerate's list, extended in place as its is)
    not_converted.extend(config.keep_in_fp32_modules)
    setattr(model, "is_loaded_in_4bit", config.load_in_4bit)  # what peft and transformers look for (plain attributes)
    setattr(model, "is_loaded_in_8bit", config.load_in_8bit)
    if get_parameter_device(model).type != "meta":
        return _quantize_loaded(model, config, not_converted)
    if weights_location is None:
        raise ValueError("the model is on the meta device, so its weights must come from a checkpoint; pass "
                         "weights_location=<a weights file, an .index.json or a folder of them>.")
    with init_empty_weights():
        model = replace_with_bnb_layers(model, config, modules_to_not_convert=not_converted)
    placed = get_quantized_model_device_map(model, config, device_map, max_memory=max_memory,
                                            no_split_module_classes=no_split_module_classes)
    offload = any(device in ("cpu", "disk") for device in placed.values())
    load_checkpoint_in_model(model, weights_location, placed, dtype=config.torch_dtype, offload_folder=offload_folder,
                             offload_state_dict=offload_state_dict, keep_in_fp32_modules=config.keep_in_fp32_modules,
                             offload_8bit_bnb=config.load_in_8bit and offload)
    return dispatch_model(model, device_map=placed, offload_dir=offload_folder)


def _quantize_loaded(model: nn.Module, config: BnbQuantizationConfig, not_converted: list[str]) -> nn.Module:
    """Accelerate's path for a model already in memory: convert, cast, then quantize by moving it."""
    logger.warning("quantizing a model that is already loaded needs its full-precision weights in memory first; "
                   "build it under init_empty_weights() and pass weights_location to load it quantized instead.")
    device = get_parameter_device(model)
    model = replace_with_bnb_layers(model, config, modules_to_not_convert=not_converted)
    fp32 = config.keep_in_fp32_modules or []
    # every alias of a tied weight is visited, so a tie through a kept module is kept in float32 too
    for name, param in model.named_parameters(remove_duplicate=False):
        if any(key in name for key in fp32):
            param.data = param.data.to(torch.float32)
        elif torch.is_floating_point(param):
            param.data = param.data.to(config.torch_dtype)
    for name, module in model.named_modules():
        if any(key in name for key in fp32):
            for param in module.parameters(recurse=False):
                param.data = param.data.to(torch.float32)
    target = device if device.type in ("cuda", "xpu") else quantizing_device()
    return model.to(target)  # bitsandbytes quantizes each weight as it moves


def get_quantized_model_device_map(model: nn.Module, bnb_quantization_config: BnbQuantizationConfig,
                                   device_map: Mapping[str, int | str | torch.device] | str | None = None,
                                   max_memory: Mapping[int | str, int | str] | None = None,
                                   no_split_module_classes: list[str] | None = None) -> dict[str, Any]:
    """The device map a quantized model loads with: the one given, one planned by a strategy name, or the default.

    Default: everything on the quantizing device (the current GPU; the CPU
    on a machine without one, where Accelerate refuses). A strategy name
    plans with the quantized sizes (``target_dtype``; skipped modules in
    ``torch_dtype``, ``keep_in_fp32_modules`` in float32). A 4-bit model
    whose converted modules the map offloads is refused, as in Accelerate;
    an 8-bit one is told they will be 8-bit there.

    Example:
        >>> from hasten.big_modeling.bnb import BnbQuantizationConfig
        >>> config = BnbQuantizationConfig(load_in_8bit=True, skip_modules=[], keep_in_fp32_modules=[])
        >>> get_quantized_model_device_map(nn.Linear(2, 2), config, {"": "cpu"})
        {'': 'cpu'}
    """
    config = bnb_quantization_config
    if device_map is None:
        device = quantizing_device()
        device_map = {"": device.index if device.type == "cuda" else str(device)}
        logger.info("no device_map was given: the model is loaded onto %s.", device)
    if isinstance(device_map, str):
        if device_map not in _STRATEGIES:
            raise ValueError(f"device_map={device_map!r} is not a strategy; pass a dict or one of "
                             f"{', '.join(repr(s) for s in _STRATEGIES)}.")
        skip, fp32 = config.skip_modules or [], config.keep_in_fp32_modules or []
        special: dict[str, Any] = {name: config.torch_dtype for name, _ in model.named_parameters()
                                   if any(key in name for key in skip)}
        special.update({name: torch.float32 for name, _ in model.named_parameters() if any(key in name for key in fp32)})
        kwargs: dict[str, Any] = dict(special_dtypes=special, no_split_module_classes=no_split_module_classes,
                                      dtype=config.target_dtype)
        if device_map != "sequential":
            max_memory = get_balanced_memory(model, low_zero=device_map == "balanced_low_0", max_memory=max_memory,
                                             **kwargs)
        device_map = infer_auto_device_map(model, max_memory=max_memory, **kwargs)
    placed = dict(device_map)
    kept = set((config.skip_modules or []) + (config.keep_in_fp32_modules or []))
    offloaded = sorted({str(device) for name, device in placed.items()
                        if name not in kept and device in offloading_devices()})
    if offloaded and config.load_in_4bit:
        raise ValueError(f"the device map offloads 4-bit modules to {' and '.join(offloaded)}, which bitsandbytes "
                         "cannot; give the GPU room for the quantized model, or pass a custom device_map that offloads "
                         "only modules kept in torch_dtype (skip_modules).")
    if offloaded:
        logger.info("some modules are offloaded to %s: they are converted to 8-bit there.", " and ".join(offloaded))
    return placed
