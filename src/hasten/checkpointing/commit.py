"""Publishing a checkpoint directory atomically, and checking one before anything is loaded from it.

Protocol: every file is written into a staging sibling (``.NAME.staging``),
hashed and fsynced; when every process reports success, the publisher writes the
manifest (`MANIFEST_NAME`, the completeness marker, last, with every file's
size and content hash: `integrity`), fsyncs, and
renames the staging directory onto its final name. A run killed at any
moment leaves either the old checkpoint or the new one, never a mix; a
directory without a manifest is never loaded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from ..core.errors import CheckpointCorrupted, CheckpointError
from .constants import MANIFEST_NAME

__all__ = [
    "CheckpointError",
    "CheckpointCorrupted",
    "staging_path",
    "begin_staging",
    "fsync_path",
    "write_manifest",
    "publish",
    "read_manifest",
    "resolve_complete",
    "check_files",
    "is_accelerate_checkpoint",
]

FORMAT = "hasten-checkpoint"
VERSION = 1


def staging_path(target: Path) -> Path:
    return target.parent / f".{target.name}.staging"


def _previous_path(target: Path) -> Path:
    return target.parent / f".{target.name}.previous"


def is_checkpoint(path: Path) -> bool:
    return (path / MANIFEST_NAME).is_file()


# The files and folders Accelerate's save_state writes (names as in `constants`), any one of which marks its folders.
_ACCELERATE_NAMES = re.compile(r"^(random_states_\d+\.pkl|model(_\d+)?\.safetensors|pytorch_model(_\d+)?\.bin|"
                               r"(optimizer|scheduler|sampler|dl_state_dict)(_\d+)?\.bin|custom_checkpoint_\d+\.pkl|"
                               r"scaler\.pt|pytorch_model(_fsdp)?(_\d+)?|optimizer_\d+)$")


def is_accelerate_checkpoint(path: Path) -> bool:
    """A folder written by Accelerate's save_state (no hasten manifest, Accelerate's file names).

    Example:
        >>> is_accelerate_checkpoint(Path("/nonexistent"))
        False
    """
    if not path.is_dir() or is_checkpoint(path):
        return False
    return any(_ACCELERATE_NAMES.match(entry.name) for entry in path.iterdir())


def begin_staging(target: Path) -> Path:
    """(Publisher only.) A fresh, empty staging directory for `target`; refuses to replace foreign files."""
    if target.exists():
        if not target.is_dir():
            raise CheckpointError(f"cannot save a checkpoint to {target}: it is a file; choose a directory path.")
        foreign = sorted(p.name for p in target.iterdir())
        if foreign and not is_checkpoint(target):
            shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
            raise CheckpointError(
                f"cannot save a checkpoint to {target}: it already holds files that are not a hasten checkpoint "
                f"({shown}); save into a new or empty directory."
            )
    staging = staging_path(target)
    shutil.rmtree(staging, ignore_errors=True)  # left over from a save that was killed
    staging.mkdir(parents=True)
    return staging


def fsync_path(path: Path) -> None:
    """Flush a file's (or a directory's entries') data to disk."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(staging: Path, manifest: dict[str, Any]) -> None:
    body = {"format": FORMAT, "version": VERSION, "saved_at": time.time(), **manifest}
    path = staging / MANIFEST_NAME
    path.write_text(json.dumps(body, indent=1, sort_keys=True))
    fsync_path(path)


def publish(staging: Path, target: Path) -> None:
    """Rename the complete staging directory onto `target` (replacing an older checkpoint there)."""
    fsync_path(staging)
    previous = _previous_path(target)
    if target.exists():
        shutil.rmtree(previous, ignore_errors=True)
        os.rename(target, previous)  # until the rename below, `previous` is the checkpoint (see resolve_complete)
    os.rename(staging, target)
    fsync_path(target.parent)
    shutil.rmtree(previous, ignore_errors=True)


def resolve_complete(target: Path) -> Path:
    """`target` if it is a complete checkpoint; the copy it replaced if a save was killed mid-rename; else an error."""
    if is_checkpoint(target) or is_accelerate_checkpoint(target):
        return target
    previous = _previous_path(target)
    if not target.exists() and is_checkpoint(previous):
        return previous
    if not target.exists():
        if staging_path(target).exists():
            raise CheckpointError(
                f"the save to {target} was interrupted before it completed (only {staging_path(target).name} exists); "
                "load an older checkpoint."
            )
        raise CheckpointError(f"no checkpoint at {target}: the directory does not exist; check the path.")
    raise CheckpointError(
        f"{target} is not a complete hasten checkpoint: it has no {MANIFEST_NAME}, which save_state writes last, and "
        "none of the files of an Accelerate checkpoint; pass a directory written by save_state."
    )


def read_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((path / MANIFEST_NAME).read_text())
    except (OSError, ValueError) as error:
        raise CheckpointCorrupted(f"the manifest of {path} cannot be read ({error}); the checkpoint is damaged.") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
        raise CheckpointCorrupted(f"{path / MANIFEST_NAME} is not a hasten checkpoint manifest; the checkpoint is damaged.")
    if manifest.get("version", 0) > VERSION:
        raise CheckpointError(
            f"{path} was written by a newer hasten (format {manifest['version']}, this one reads {VERSION}); upgrade hasten."
        )
    return manifest


def check_files(path: Path, manifest: dict[str, Any], names: list[str]) -> None:
    """Every named file exists with the size the manifest recorded (`integrity` then checks their bytes)."""
    sizes = manifest["files"]
    for name in names:
        if name not in sizes:
            raise CheckpointError(f"{path} has no {name} in its manifest; it was saved by a different setup.")
        file = path / name
        if not file.is_file():
            raise CheckpointCorrupted(f"{path} is damaged: {name} is missing.")
        if file.stat().st_size != sizes[name]:
            raise CheckpointCorrupted(
                f"{path} is damaged: {name} has {file.stat().st_size} bytes, the manifest says {sizes[name]}."
            )
