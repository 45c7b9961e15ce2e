"""8-bit bitsandbytes weights on disk: their row scales (``SCB``) travel with them, as in Accelerate's files.

A quantized 8-bit weight is int8 rows plus one scale per row. bitsandbytes'
`Linear8bitLt` saves the scales beside the weight as ``<module>.SCB``, and
Accelerate's offload folders do the same (``<module>.SCB.dat``, the weight's
name with "weight" replaced by "SCB"). Here:

- `quantize_and_offload_8bit`: quantize one weight (on the GPU, or with
  bitsandbytes' CPU backend on the CPU) and write it and its scales to an
  offload folder, leaving the model's weight on ``meta``;
- `scale_name`: where a weight's scales are stored;
- `ScalePairing`: a checkpoint is read one tensor at a time, and a weight's
  scales may come before or after it in the file; the pairing holds the
  first of the two until the other arrives.

Example:
    >>> scale_name("encoder.layer.0.weight")
    'encoder.layer.0.SCB'
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from .bnb_params import is_quantized_param, quantizing_device
from .offload import offload_weight
from .sizes import _owner, set_module_tensor_to_device

__all__ = ["ScalePairing", "quantize_and_offload_8bit", "scale_name", "scales_for"]


def scale_name(weight_name: str) -> str:
    """The name under which an 8-bit weight's row scales are stored (Accelerate's: "weight" -> "SCB").

    Example:
        >>> scale_name("lm.weight")
        'lm.SCB'
    """
    return weight_name.replace("weight", "SCB")


def scales_for(weights_map: Any, name: str, value: torch.Tensor) -> torch.Tensor | None:
    """The row scales `weights_map` holds beside the int8 weight `name` (None for any other tensor), as hooks need.

    Example:
        >>> weights = {"w.weight": torch.ones(2, 2, dtype=torch.int8), "w.SCB": torch.ones(2)}
        >>> scales_for(weights, "w.weight", weights["w.weight"])
        tensor([1., 1.])
    """
    key = scale_name(name)
    if "weight" in name and value.dtype == torch.int8 and key in weights_map:
        return weights_map[key]  # type: ignore[no-any-return]
    return None


def quantize_and_offload_8bit(model: nn.Module, param: torch.Tensor, param_name: str, new_dtype: torch.dtype,
                              offload_folder: str | os.PathLike[str], offload_index: dict[str, Any],
                              fp16_statistics: torch.Tensor | None) -> None:
    """Write the 8-bit form of `param` (the weight `param_name` of `model`) and its scales to `offload_folder`.

    Without `fp16_statistics`, `param` is quantized first: placed into the
    model's weight on the device bitsandbytes quantizes on (the current GPU,
    else the CPU); with them, `param` is taken as already quantized. Either
    way the weight and its ``SCB`` are written (and entered in
    `offload_index`), and the model's weight is left on ``meta`` in
    `new_dtype`, to be brought back by the offload hooks.

    Example:
        >>> import tempfile
        >>> model, index = nn.Sequential(nn.Linear(2, 2)), {}
        >>> quantize_and_offload_8bit(model, torch.ones(2, 2, dtype=torch.int8), "0.weight", torch.float16,
        ...                           tempfile.mkdtemp(), index, fp16_statistics=torch.ones(2))
        >>> sorted(index), model[0].weight.device
        (['0.SCB', '0.weight'], device(type='meta'))
    """
    if fp16_statistics is None:
        set_module_tensor_to_device(model, param_name, quantizing_device(), dtype=new_dtype, value=param)
        owner, leaf = _owner(model, param_name)
        weight: Any = owner._parameters[leaf]  # a bitsandbytes Int8Params (or a plain weight): its SCB, if any
        weight.requires_grad = False
        offload_weight(weight.data, param_name, offload_folder, index=offload_index)
        if getattr(weight, "SCB", None) is not None:
            offload_weight(weight.SCB, scale_name(param_name), offload_folder, index=offload_index)
    else:
        offload_weight(param, param_name, offload_folder, index=offload_index)
        offload_weight(fp16_statistics, scale_name(param_name), offload_folder, index=offload_index)
    set_module_tensor_to_device(model, param_name, "meta", dtype=new_dtype, value=torch.empty(*param.size()))


class ScalePairing:
    """Brings together, while a checkpoint streams, each int8 weight of an 8-bit layer and its scales.

    `take(name, tensor)` is given every tensor read: scales (a name holding
    "SCB") are never tensors of the model and give None until their weight
    is there; an int8 weight of a quantized parameter whose scales have not
    come yet is held and gives None. Otherwise it gives ``(name, tensor,
    scales or None)`` to place now. `left()` gives the weights whose scales
    never came (placed without them, as Accelerate does).

    Example:
        >>> pairing = ScalePairing(nn.Linear(2, 2))
        >>> pairing.take("SCB", torch.ones(2)) is None, pairing.take("bias", torch.zeros(2))[2]
        (True, None)
    """

    def __init__(self, model: nn.Module) -> None:
        self._model = model
        self._scales: dict[str, torch.Tensor] = {}
        self._held: dict[str, tuple[str, torch.Tensor]] = {}  # scale name -> the weight waiting for it

    def take(self, name: str, tensor: Any) -> tuple[str, Any, torch.Tensor | None] | None:
        if "SCB" in name:
            held = self._held.pop(name, None)
            if held is None:
                self._scales[name] = tensor
                return None
            return held[0], held[1], tensor
        if "weight" not in name or getattr(tensor, "dtype", None) != torch.int8:
            return name, tensor, None
        scales = self._scales.pop(scale_name(name), None)
        if scales is None and self._quantized(name):
            self._held[scale_name(name)] = (name, tensor)
            return None
        return name, tensor, scales

    def left(self) -> list[tuple[str, Any, None]]:
        held, self._held = list(self._held.values()), {}
        return [(name, tensor, None) for name, tensor in held]

    def stream(self, tensors: Iterable[tuple[str, str, Any]]) -> Iterator[tuple[str, str, Any, torch.Tensor | None]]:
        """``(file, name, tensor, scales)`` for ``(file, name, tensor)`` read one at a time, each weight with its scales."""
        file_of: dict[str, str] = {}
        for file_name, name, tensor in tensors:
            file_of[name] = file_name
            ready = self.take(name, tensor)
            if ready is not None:
                yield (file_of.pop(ready[0], file_name), *ready)
        for name, tensor, scales in self.left():
            yield file_of.pop(name, ""), name, tensor, scales

    def _quantized(self, name: str) -> bool:
        try:
            owner, leaf = _owner(self._model, name)
        except (AttributeError, ValueError):
            return False
        return is_quantized_param(owner._parameters.get(leaf))
