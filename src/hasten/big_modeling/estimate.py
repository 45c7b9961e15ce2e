"""`hasten estimate-memory`: how much memory a model needs, without reading its weights.

The model's tensors (name, element count, dtype) come from the cheapest
source that knows them exactly:

- a checkpoint (a model folder with safetensors, or an index json): only the
  safetensors headers are read, so no weights, no model code, no torch import;
- otherwise the model is built on the `meta` device — a `transformers`
  config (folder, config.json, or a cached hub name) or `module:Class` — and
  its parameters and buffers are listed.

Per dtype it reports the total size, the largest layer (the biggest block
that is loaded or gathered as a unit: the tensors under the first numbered
path component, e.g. ``encoder.layer.3``, else one module) and the memory to
train with Adam (weights, gradients and two optimizer states), whole and per
rank under FSDP / ZeRO-3. Activations are not counted: they depend on batch
and sequence length.
"""

from __future__ import annotations

import importlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

__all__ = ["TensorInfo", "MemoryEstimate", "model_tensors", "estimate_memory", "format_estimate", "DTYPE_BYTES"]

# Bytes per element of each dtype the table can be asked for (int4 packs two weights in a byte). Not
# sizes.dtype_byte_size / utils.convert_bytes: those modules import torch, and the header path must not.
DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "int8": 1.0, "int4": 0.5}
DTYPE_ALIASES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "float32": "float32", "float16": "float16",
                 "bfloat16": "bfloat16", "int8": "int8", "int4": "int4"}
_SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
                      "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass(frozen=True)
class TensorInfo:
    """One weight or buffer: its name, element count, whether it is floating point, and its stored bytes per element."""

    name: str
    numel: int
    floating: bool
    itemsize: float


@dataclass(frozen=True)
class MemoryEstimate:
    """Memory for one dtype, in bytes (training figures are None for int8/int4: quantized weights are not trained)."""

    dtype: str
    total: int
    largest_layer: int
    largest_layer_name: str
    training: int | None
    training_per_rank: int | None


# -- where the tensors come from ----------------------------------------------------------------
def _safetensors_header(path: Path) -> list[TensorInfo]:
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        if length > 100 * 2**20:
            raise ValueError(f"{path} does not look like a safetensors file (header of {length} bytes).")
        header = json.loads(handle.read(length))
    infos = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        numel = 1
        for size in entry["shape"]:
            numel *= size
        dtype = entry["dtype"]
        infos.append(TensorInfo(name, numel, dtype.startswith(("F", "BF")), _SAFETENSORS_BYTES.get(dtype, 4)))
    return infos


def _checkpoint_tensors(path: Path) -> list[TensorInfo] | None:
    """The tensors listed in a safetensors checkpoint at `path` (file, index json or folder), else None."""
    if path.is_dir():
        for name in ("model.safetensors.index.json", "model.safetensors"):
            if (path / name).is_file():
                return _checkpoint_tensors(path / name)
        return None
    if path.name.endswith(".safetensors.index.json"):
        shards = dict.fromkeys(json.loads(path.read_text())["weight_map"].values())
        return [info for shard in shards for info in _safetensors_header(path.parent / shard)]
    if path.suffix == ".safetensors":
        return _safetensors_header(path)
    return None


def _module_tensors(model: Any) -> list[TensorInfo]:
    """Parameters (tied ones once) and persistent buffers: what a checkpoint of `model` would hold."""
    seen: set[int] = set()
    infos = []
    named = list(model.named_parameters(remove_duplicate=False))
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        named += [(prefix + name, buffer) for name, buffer in module._buffers.items()
                  if buffer is not None and name not in module._non_persistent_buffers_set]
    for name, tensor in named:
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        infos.append(TensorInfo(name, tensor.numel(), tensor.is_floating_point(), tensor.element_size()))
    return infos


def _build_on_meta(spec: str, trust_remote_code: bool = False) -> Any:
    """The model named by `spec` (`module:Class`, or a transformers config / folder / cached name) on `meta`."""
    import torch

    if ":" in spec and not os.path.exists(spec):
        module_name, _, attribute = spec.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as error:
            raise ValueError(f"cannot import {spec!r} ({error}); write it as module.path:ClassName.") from None
        with torch.device("meta"):
            return factory()
    try:
        from transformers import AutoConfig, AutoModel
    except ImportError:
        raise ValueError(f"{spec!r} needs the transformers package to build it: pip install transformers "
                         "(or pass a folder with safetensors weights, or module:Class).") from None
    try:
        config = AutoConfig.from_pretrained(spec, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:
        raise ValueError(f"no model config found for {spec!r}: pass a local model folder, a config.json, or a name "
                         f"already in the Hugging Face cache (this machine may be offline). ({str(error)[:120]})") from None
    with torch.device("meta"):
        return AutoModel.from_config(config, trust_remote_code=trust_remote_code)


def model_tensors(spec: str, trust_remote_code: bool = False) -> list[TensorInfo]:
    """The tensors of the model named by `spec`, read from checkpoint headers when it has some, else built on meta.

    Example:
        >>> [t.numel for t in model_tensors("torch.nn:Identity")]
        []
    """
    path = Path(spec)
    if path.exists():
        found = _checkpoint_tensors(path)
        if found is not None:
            return found
    return _module_tensors(_build_on_meta(spec, trust_remote_code))


# -- the arithmetic -------------------------------------------------------------------------------
def _layer_of(name: str) -> str:
    """The block a tensor belongs to: up to the first numbered path component, else its module."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1]) or name


def _bytes(info: TensorInfo, dtype: str) -> float:
    return info.numel * (DTYPE_BYTES[dtype] if info.floating else info.itemsize)


def estimate_memory(tensors: Iterable[TensorInfo], dtypes: Iterable[str] = ("float32", "bfloat16", "int8", "int4"),
                    num_processes: int = 1) -> list[MemoryEstimate]:
    """Size, largest layer and Adam training memory of `tensors` for each dtype (per rank over `num_processes`).

    Example:
        >>> [e.total for e in estimate_memory([TensorInfo("w", 10, True, 4)], ["fp32", "bf16"])]
        [40, 20]
    """
    tensors = list(tensors)
    if num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}.")
    estimates = []
    for requested in dtypes:
        dtype = DTYPE_ALIASES.get(str(requested).lower())
        if dtype is None:
            raise ValueError(f"unknown dtype {requested!r}; choose from {', '.join(sorted(DTYPE_ALIASES))}.")
        layers: dict[str, float] = {}
        for info in tensors:
            layers[_layer_of(info.name)] = layers.get(_layer_of(info.name), 0.0) + _bytes(info, dtype)
        total = sum(layers.values())
        largest_name, largest = max(layers.items(), key=lambda item: item[1], default=("", 0.0))
        trainable = dtype not in ("int8", "int4")
        # Adam: weights + gradients + two moment buffers, each the size of the weights in this dtype.
        training = 4 * total if trainable else None
        # FSDP / ZeRO-3 shard all four; one block is gathered whole while it runs.
        per_rank = training / num_processes + largest if training is not None else None
        estimates.append(MemoryEstimate(dtype, int(total), int(largest), largest_name,
                                        None if training is None else int(training),
                                        None if per_rank is None else int(per_rank)))
    return estimates


def _human(size: int | None) -> str:
    if size is None:
        return "n/a"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{size} B"


def format_estimate(spec: str, tensors: list[TensorInfo], estimates: list[MemoryEstimate], num_processes: int) -> str:
    """The table `hasten estimate-memory` prints."""
    parameters = sum(t.numel for t in tensors)
    rank_column = f"per rank, {num_processes} ranks (FSDP/ZeRO-3)"
    header = ["dtype", "total size", "largest layer", "training with Adam", rank_column]
    rows = [[e.dtype, _human(e.total), _human(e.largest_layer), _human(e.training), _human(e.training_per_rank)]
            for e in estimates]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    line = "+-" + "-+-".join("-" * w for w in widths) + "-+"

    def render(row: list[str]) -> str:
        return "| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths)) + " |"

    largest = estimates[0].largest_layer_name if estimates else ""
    lines = [f"Memory to load and train {spec}: {parameters:,} elements in {len(tensors)} tensors "
             f"(largest layer: {largest or '-'})", line, render(header), line, *map(render, rows), line,
             "Training = weights + gradients + 2 Adam states in that dtype; with mixed precision (fp32 master "
             "weights) read the float32 row. Activations are not included."]
    return "\n".join(lines)
