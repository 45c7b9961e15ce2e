"""Putting data into bitsandbytes' quantized parameters (`Int8Params`, `Params4bit`), as Accelerate's placement does.

bitsandbytes quantizes a parameter when it moves from the CPU to a device
(the CPU itself included, in releases with its CPU backend): an 8-bit
weight becomes int8 rows with one scale per row (``SCB``, the "fp16
statistics" Accelerate's functions pass around), a 4-bit one packed bytes
with a ``quant_state``. `set_module_tensor_to_device` hands such parameters
here, so that a placement quantizes instead of silently storing floats:

- the new data is staged on the CPU and moved to the target through the
  parameter's own class (rebuilt with the old parameter's settings), so
  bitsandbytes quantizes it on the way, as it does under Accelerate;
- an 8-bit parameter receives float32 data as float16 (what bitsandbytes'
  8-bit serialisation expects, as Accelerate does);
- data that is already quantized (int8 rows read back from disk) is kept
  as it is and given its statistics (`fp16_statistics`) as ``SCB``.

bitsandbytes is never imported here: parameters are recognised by class name.

Example:
    >>> import torch
    >>> is_quantized_param(torch.nn.Parameter(torch.ones(1)))
    False
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["QUANTIZED_PARAMS", "is_quantized_param", "place_quantized", "quantizing_device"]

QUANTIZED_PARAMS = ("Int8Params", "FP4Params", "Params4bit")  # Accelerate's list of bitsandbytes parameter classes


def is_quantized_param(tensor: Any) -> bool:
    """Whether `tensor` is one of bitsandbytes' quantized parameter classes (by name, as Accelerate checks).

    Example:
        >>> is_quantized_param(type("Int8Params", (torch.nn.Parameter,), {})(torch.ones(1)))
        True
    """
    return type(tensor).__name__ in QUANTIZED_PARAMS


def place_quantized(old: torch.Tensor, data: torch.Tensor, device: torch.device,
                    fp16_statistics: torch.Tensor | None = None) -> torch.nn.Parameter:
    """A parameter of `old`'s class holding `data` on `device`, quantized by bitsandbytes on the way there.

    `old` gives the class and its settings (4-bit block size and quant
    type, ``has_fp16_weights``, ...), kept on ``meta`` too so that the
    weight quantizes as configured when it arrives; `data` is float
    (quantized here unless `device` is ``meta``) or already quantized (int8
    rows, with their scales in `fp16_statistics`).

    Example:
        >>> Fake = type("Params4bit", (torch.nn.Parameter,), {})  # a stand-in: real ones quantize in `.to`
        >>> place_quantized(Fake(torch.ones(2)), torch.zeros(2), torch.device("meta")).device
        device(type='meta')
    """
    cls: Any = type(old)
    settings = {key: value for key, value in vars(old).items() if key != "_is_hf_initialized"}
    if cls.__name__ == "Int8Params" and data.dtype == torch.float32:
        data = data.to(torch.float16)  # what 8-bit serialisation expects (Accelerate does the same)
    if data.is_floating_point():  # new float data is quantized afresh, whatever `old` held
        settings = {key: value for key, value in settings.items() if key not in ("CB", "SCB", "quant_state")}
        if "bnb_quantized" in settings:
            settings["bnb_quantized"] = False
    if device.type == "meta":
        placed = cls(data.to(device), requires_grad=old.requires_grad,
                     **{key: value for key, value in settings.items() if key not in ("CB", "SCB", "quant_state")})
    else:
        try:  # bitsandbytes quantizes as the parameter leaves the CPU
            placed = cls(data.to("cpu"), requires_grad=old.requires_grad, **settings).to(device)
        except (RuntimeError, NotImplementedError) as error:
            raise RuntimeError(
                f"bitsandbytes could not quantize a {tuple(data.shape)} weight onto {device} ({error}); on a machine "
                "without a GPU upgrade bitsandbytes (recent releases quantize on the CPU), or load onto a GPU.") from error
    hf_initialized = getattr(old, "_is_hf_initialized", None)
    if hf_initialized is not None:  # transformers' mark travels with the weight, as in Accelerate
        placed._is_hf_initialized = hf_initialized
    if fp16_statistics is not None:
        placed.SCB = fp16_statistics.to(device)
    return placed


def quantizing_device() -> torch.device:
    """Where bitsandbytes quantizes when no device is named: the current GPU (CUDA, then XPU), else the CPU.

    Accelerate needs a GPU there; recent bitsandbytes releases quantize on the CPU as well, so hasten falls back to it.

    Example:
        >>> quantizing_device().type in ("cuda", "xpu", "cpu")
        True
    """
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return torch.device("xpu", xpu.current_device())
    return torch.device("cpu")
