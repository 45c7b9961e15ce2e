"""Model weights as files: sharded safetensors with an index (`save_model`), and loading them back.

The layout is the one the Hugging Face ecosystem reads: ``model.safetensors``
for one shard, else ``model-00001-of-00003.safetensors`` ... plus
``model.safetensors.index.json`` mapping each tensor to its shard.
`load_checkpoint_in_model` lives in `hasten.big_modeling.loading` and is re-exported here.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

import torch

from ..big_modeling.loading import load_checkpoint_in_model  # kept importable from here
from ..big_modeling.sizes import _parse_size
from ..core.saving import _safetensors_dict, atomic_write
from .constants import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

__all__ = ["parse_size", "shard_state_dict", "write_model_files", "write_weights", "read_weights_file",
           "load_checkpoint_in_model"]


def parse_size(size: int | str) -> int:
    """Bytes in a size such as ``"10GB"``, ``"500MiB"`` or an int (the parser of `convert_file_size_to_int`).

    Example:
        >>> parse_size("10GB"), parse_size("1KiB"), parse_size(7)
        (10000000000, 1024, 7)
    """
    return _parse_size(size, "max_shard_size")


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
    def write_index(tmp: str) -> None:
        Path(tmp).write_text(body)

    atomic_write(index, write_index)
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
