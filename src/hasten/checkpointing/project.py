"""`ProjectConfiguration` and the automatic checkpoint folder: naming, finding the newest complete one, rotation."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .constants import CHECKPOINT_PREFIX, CHECKPOINTS_DIR, MANIFEST_NAME

if TYPE_CHECKING:
    from .periodic import PeriodicSaves

__all__ = ["ProjectConfiguration", "checkpoints_root", "list_checkpoints", "latest_checkpoint", "rotate_checkpoints"]


@dataclass
class ProjectConfiguration:
    """Where a run keeps its checkpoints and logs, and how checkpoints are named and rotated.

    With `automatic_checkpoint_naming=True`, `save_state()` writes
    ``project_dir/checkpoints/checkpoint_<iteration>`` and `load_state()`
    loads the newest complete one; `total_limit` keeps only that many
    (older ones are removed only after a new one is complete).

    `fallback_on_damage` (hasten's field; Accelerate has none): when the
    newest checkpoint that `load_state()` picks by itself is damaged (a
    file's bytes no longer match the hash its manifest recorded, or a file
    is missing, truncated or unreadable), load the newest complete
    undamaged one before it instead of raising `CheckpointCorrupted`, and
    log a warning naming both; the next save goes past the damaged one,
    which stays on disk. Off by default: silently resuming from an older
    state is a decision for the user. It lives here, not as a `load_state`
    argument, because `load_state` keeps Accelerate's signature (whose
    extra keywords go to the model loader) and because it is a policy of
    the project's automatic checkpoints, set once where they are set up;
    a `load_state(input_dir)` call names its checkpoint and never falls back.

    `save_every_n_steps` / `save_every_n_seconds` (hasten's fields too):
    a checkpoint every N optimizer steps, or every N seconds, written in the
    background at the batch boundary after an optimizer step (see
    `hasten.checkpointing.periodic`); they need automatic naming. With
    ``accelerator.load_state()`` at the start of the script, that is all an
    automatic restart, a preemption or an elastic re-formation needs.

    Example:
        >>> config = ProjectConfiguration("runs/demo", automatic_checkpoint_naming=True, total_limit=2)
        >>> config.logging_dir
        'runs/demo'
    """

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False
    fallback_on_damage: bool = False
    # hasten's periodic checkpoints (`periodic.py`): every N optimizer steps or seconds, in the background
    save_every_n_steps: int | None = None
    save_every_n_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.total_limit is not None and (not isinstance(self.total_limit, int) or self.total_limit < 1):
            raise ValueError(f"total_limit must be an integer >= 1 (or None to keep every checkpoint), got {self.total_limit!r}.")
        if not isinstance(self.iteration, int) or self.iteration < 0:
            raise ValueError(f"iteration must be an integer >= 0, got {self.iteration!r}.")
        self.set_directories(self.project_dir)
        periodic = self.periodic_saves()
        if periodic is not None and not self.automatic_checkpoint_naming:
            raise ValueError("save_every_n_steps / save_every_n_seconds write automatically named checkpoints; add "
                             "automatic_checkpoint_naming=True (and a project_dir).")

    def periodic_saves(self) -> PeriodicSaves | None:
        """The periodic-checkpoint policy these settings ask for (None: only the script's own saves).

        Example:
            >>> ProjectConfiguration("runs", automatic_checkpoint_naming=True, save_every_n_steps=100).periodic_saves()
            ... # doctest: +ELLIPSIS
            PeriodicSaves(every_steps=100, every_seconds=None, ...)
        """
        if self.save_every_n_steps is None and self.save_every_n_seconds is None:
            return None
        from .periodic import PeriodicSaves  # loaded by the runs that save periodically

        return PeriodicSaves(every_steps=self.save_every_n_steps, every_seconds=self.save_every_n_seconds)

    def set_directories(self, project_dir: str | os.PathLike[str] | None = None) -> None:
        """Set `project_dir` (and `logging_dir` when it was not given)."""
        self.project_dir = None if project_dir is None else os.fspath(project_dir)
        if self.logging_dir is None:
            self.logging_dir = self.project_dir


def checkpoints_root(config: ProjectConfiguration) -> Path:
    if config.project_dir is None:
        raise ValueError(
            "automatic_checkpoint_naming needs a project directory; pass Accelerator(project_dir=...) "
            "or ProjectConfiguration(project_dir=...)."
        )
    return Path(config.project_dir) / CHECKPOINTS_DIR


_NAME = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")


def list_checkpoints(root: Path, complete_only: bool = True) -> list[tuple[int, Path]]:
    """(iteration, path) of the checkpoints under `root`, oldest first; by default only complete ones.

    Complete: published by hasten (it has the manifest), or written by Accelerate (its files, no manifest), so
    a run that switches from Accelerate resumes from Accelerate's newest checkpoint.
    """
    if not root.is_dir():
        return []
    from .commit import is_accelerate_checkpoint  # (the commit module is loaded when checkpoints are looked for)

    found = []
    for entry in root.iterdir():
        match = _NAME.match(entry.name)
        if match and entry.is_dir() and (not complete_only or (entry / MANIFEST_NAME).is_file()
                                         or is_accelerate_checkpoint(entry)):
            found.append((int(match.group(1)), entry))
    return sorted(found)


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under `root` (a partial one, killed mid-write, is never chosen)."""
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def rotate_checkpoints(root: Path, total_limit: int | None, keep: Path) -> list[Path]:
    """Remove the oldest complete checkpoints beyond `total_limit` (never `keep`); returns what was removed."""
    if total_limit is None:
        return []
    found = [path for _, path in list_checkpoints(root) if path != keep]
    excess = len(found) + 1 - total_limit
    removed = found[: max(0, excess)]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed
