"""Names of model weight files, as Accelerate and transformers write them (one file, or shards and an index).

`checkpoint_files` finds them for `load_checkpoint_in_model`; the checkpoint layer writes a
model under the same names (`hasten.checkpointing.constants` re-exports them).

Example:
    >>> from hasten.big_modeling.filenames import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_PATTERN_NAME
    >>> SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_PATTERN_NAME.format(suffix="-00001-of-00002")
    ('model.safetensors.index.json', 'model-00001-of-00002.safetensors')
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["checkpoint_files", "MODEL_NAME", "SAFE_MODEL_NAME", "WEIGHTS_NAME", "SAFE_WEIGHTS_NAME", "WEIGHTS_INDEX_NAME",
           "SAFE_WEIGHTS_INDEX_NAME", "WEIGHTS_PATTERN_NAME", "SAFE_WEIGHTS_PATTERN_NAME"]

MODEL_NAME = "pytorch_model"
SAFE_MODEL_NAME = "model"
WEIGHTS_NAME = f"{MODEL_NAME}.bin"
SAFE_WEIGHTS_NAME = f"{SAFE_MODEL_NAME}.safetensors"
WEIGHTS_INDEX_NAME = f"{WEIGHTS_NAME}.index.json"
SAFE_WEIGHTS_INDEX_NAME = f"{SAFE_WEIGHTS_NAME}.index.json"
WEIGHTS_PATTERN_NAME = "pytorch_model{suffix}.bin"
SAFE_WEIGHTS_PATTERN_NAME = "model{suffix}.safetensors"


def checkpoint_files(checkpoint: str | os.PathLike[str]) -> list[Path]:
    """The weight files of `checkpoint`: a weights file, an ``*.index.json`` of shards, or a folder holding either.

    In a folder, safetensors wins over torch files and an index over a
    single file (`save_model` never leaves both). Every shard an index
    names must exist.

    Example:
        >>> import tempfile, torch
        >>> from hasten.checkpointing.model_files import write_model_files
        >>> folder = tempfile.mkdtemp(); _ = write_model_files({"w": torch.ones(1)}, folder)
        >>> [p.name for p in checkpoint_files(folder)]
        ['model.safetensors']
    """
    path = Path(checkpoint)
    if path.is_dir():
        for name in (SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME):
            if (path / name).is_file():
                return checkpoint_files(path / name)
        indexes = sorted(path.glob("*.index.json"))
        if len(indexes) == 1:
            return checkpoint_files(indexes[0])
        found = f"several index files ({', '.join(p.name for p in indexes)}); delete the stale ones" if indexes else "no weights"
        raise ValueError(f"{path} holds {found}: expected {SAFE_WEIGHTS_NAME}, {SAFE_WEIGHTS_INDEX_NAME}, {WEIGHTS_NAME} "
                         f"or {WEIGHTS_INDEX_NAME}.")
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}: give a weights file, an .index.json or a folder holding them.")
    if not path.name.endswith(".json"):
        return [path]
    try:
        weight_map = json.loads(path.read_text(encoding="utf-8"))
        weight_map = weight_map.get("weight_map", weight_map)
        shards = [path.parent / name for name in dict.fromkeys(weight_map.values())]
    except (ValueError, AttributeError, TypeError):
        raise ValueError(f"{path} is not a checkpoint index (JSON with a 'weight_map' of tensor -> shard file); "
                         "re-save the checkpoint or download it again.") from None
    for shard in shards:
        if not shard.is_file():
            raise FileNotFoundError(f"shard {shard.name} listed in {path.name} is missing from {path.parent}; download or "
                                    "copy it again (or re-save the checkpoint).")
    return shards
