"""Model weights as files: sharded safetensors with an index (`save_model`), and loading them back.

The layout is the one the Hugging Face ecosystem reads: ``model.safetensors``
for one shard, else ``model-00001-of-00003.safetensors`` ... plus
``model.safetensors.index.json`` mapping each tensor to its shard.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

from ..saving import _safetensors_dict, atomic_write
from .constants import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

__all__ = ["parse_size", "shard_state_dict", "write_model_files", "write_weights", "read_weights_file",
           "load_checkpoint_in_model"]

_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(size: int | str) -> int:
    """Bytes in a size such as ``"10GB"``, ``"500MiB"`` or an int.

    Example:
        >>> parse_size("10GB"), parse_size("1KiB"), parse_size(7)
        (10000000000, 1024, 7)
    """
    if isinstance(size, int):
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B)\s*", str(size).upper())
    if not match:
        raise ValueError(f"max_shard_size={size!r} is not a size; write it like '10GB', '500MB' or '2GiB'.")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def shard_state_dict(state: Mapping[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    """Split a state dict into consecutive shards of at most `max_bytes` (a bigger tensor gets a shard of its own)."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards


def write_model_files(state: Mapping[str, torch.Tensor], directory: str | os.PathLike[str], max_shard_size: int | str = "10GB",
                      safe_serialization: bool = True) -> list[str]:
    """Write `state` as one file or as shards + index into `directory`; returns the file names written.

    Shards of an earlier save with the same base name are removed, so the
    directory never mixes two saves.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    weights_name, index_name = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME) if safe_serialization else (WEIGHTS_NAME, WEIGHTS_INDEX_NAME)
    stem, ext = weights_name.rsplit(".", 1)
    shards = shard_state_dict(state, parse_size(max_shard_size))
    names = [weights_name] if len(shards) == 1 else [f"{stem}-{i + 1:05d}-of-{len(shards):05d}.{ext}" for i in range(len(shards))]
    stale = re.compile(rf"^{re.escape(stem)}(-\d{{5}}-of-\d{{5}})?\.{ext}$")
    for old in directory.iterdir():
        if stale.match(old.name) and old.name not in names:
            old.unlink()
    for name, shard in zip(names, shards):
        write_weights(shard, directory / name, safe_serialization)
    index = directory / index_name
    if len(shards) == 1:
        if index.exists():
            index.unlink()
        return names
    weight_map = {key: name for name, shard in zip(names, shards) for key in shard}
    total = sum(t.numel() * t.element_size() for t in state.values())
    body = json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2, sort_keys=True)
    atomic_write(index, lambda tmp: Path(tmp).write_text(body))
    return [*names, index_name]


def write_weights(tensors: Mapping[str, torch.Tensor], path: Path, safe_serialization: bool) -> None:
    """One weights file, atomically: safetensors (tied weights cloned) or a torch file of CPU tensors."""
    if safe_serialization:
        from safetensors.torch import save_file

        prepared = _safetensors_dict(tensors)
        atomic_write(path, lambda tmp: save_file(prepared, tmp, metadata={"format": "pt"}))
    else:
        cpu = {k: v.detach().cpu() for k, v in tensors.items()}
        atomic_write(path, lambda tmp: torch.save(cpu, tmp))


def read_weights_file(path: str | os.PathLike[str], device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Tensors of one ``.safetensors`` or torch file (the latter with ``weights_only=True``)."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(path, device=str(device))
    return torch.load(path, map_location=device, weights_only=True)


def _checkpoint_files(checkpoint: Path) -> list[Path]:
    if checkpoint.is_file():
        if checkpoint.name.endswith(".index.json"):
            weight_map = json.loads(checkpoint.read_text())["weight_map"]
            return [checkpoint.parent / name for name in dict.fromkeys(weight_map.values())]
        return [checkpoint]
    if checkpoint.is_dir():
        for name in (SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_NAME):
            if (checkpoint / name).is_file():
                return _checkpoint_files(checkpoint / name)
        raise FileNotFoundError(
            f"{checkpoint} holds no weights: expected {SAFE_WEIGHTS_NAME}, {SAFE_WEIGHTS_INDEX_NAME}, {WEIGHTS_NAME} "
            f"or {WEIGHTS_INDEX_NAME}."
        )
    raise FileNotFoundError(f"no weights at {checkpoint}: the path does not exist.")


def load_checkpoint_in_model(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: Any = None,
    offload_folder: str | None = None,
    dtype: str | torch.dtype | None = None,
    offload_state_dict: bool = False,
    offload_buffers: bool = False,
    keep_in_fp32_modules: list[str] | None = None,
    offload_8bit_bnb: bool = False,
    strict: bool = False,
) -> None:
    """Load weights (a file, an index json, or a folder written by `save_model`) into `model`, shard by shard.

    Only one shard is in memory at a time. `dtype` casts floating-point
    weights (except under `keep_in_fp32_modules`). With `strict=True`,
    missing or unexpected keys are an error naming them.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp(); net = nn.Linear(2, 2)
        >>> _ = write_model_files(net.state_dict(), folder)
        >>> load_checkpoint_in_model(nn.Linear(2, 2), folder)
    """
    if device_map is not None or offload_folder is not None or offload_state_dict or offload_buffers or offload_8bit_bnb:
        raise NotImplementedError(
            "load_checkpoint_in_model with device_map or offloading needs big-model loading, which this hasten "
            "version does not have yet; load without them (the model's own device is used)."
        )
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.replace("torch.", ""))
    expected = model.state_dict()
    fp32_prefixes = tuple(keep_in_fp32_modules or ())
    loaded: set[str] = set()
    unexpected: list[str] = []
    for file in _checkpoint_files(Path(checkpoint)):
        shard = read_weights_file(file)
        for name, tensor in shard.items():
            if name not in expected:
                unexpected.append(name)
                continue
            target = expected[name]
            if target.shape != tensor.shape:
                raise ValueError(f"{name} has shape {tuple(tensor.shape)} in {file.name} but {tuple(target.shape)} in the model.")
            if dtype is not None and tensor.is_floating_point() and not name.startswith(fp32_prefixes):
                tensor = tensor.to(dtype)
            with torch.no_grad():
                if target.is_meta:
                    _assign(model, name, tensor)
                elif tensor.dtype != target.dtype and dtype is not None:
                    _assign(model, name, tensor.to(target.device))
                else:
                    target.copy_(tensor)
            loaded.add(name)
        del shard
    missing = [name for name in expected if name not in loaded]
    if strict and (missing or unexpected):
        raise ValueError(f"the checkpoint does not fit the model: missing keys {missing[:5]}, unexpected keys {unexpected[:5]}.")


def _assign(model: nn.Module, name: str, tensor: torch.Tensor) -> None:
    module_name, _, leaf = name.rpartition(".")
    module = model.get_submodule(module_name)
    if leaf in module._parameters:
        old = module._parameters[leaf]
        module._parameters[leaf] = nn.Parameter(tensor, requires_grad=old.requires_grad if old is not None else True)
    else:
        module._buffers[leaf] = tensor
