"""Checkpoints: everything a run needs to continue exactly, written so that none is ever lost.

- `constants.py`: the file names inside a checkpoint (Accelerate's).
- `project.py`: `ProjectConfiguration`, automatic naming, finding the newest complete checkpoint, rotation.
- `commit.py`: staging, fsync, manifest last, atomic rename; checks before loading.
- `integrity.py`: a content hash of every file in the manifest, taken while saving, checked before loading.
- `failures.py`: a failed write (disk full, file too large, no permission) as one sentence every process raises.
- `state.py`: what a checkpoint holds; what saving and loading share (names, formats, agreement, reading pickles).
- `save.py`: saving, by every process together or by the main process alone (`handshake.py` finds out which).
- `load.py`: read and check everything, agree, then apply; `foreign.py`: folders written by Accelerate itself;
  `contents.py`: what both read into, and their checks.
- `rng.py`: every RNG of a process as weights_only-loadable values.
- `model_files.py`: `save_model`'s sharded safetensors + index (`load_checkpoint_in_model`, from `big_modeling.loading`).
- `saveset.py`: `SaveSet`, the plain value saving and loading are handed (what to save, who saves, the strategy's seam).
- `plain.py`: Accelerate's lower-level `save_accelerator_state` / `load_accelerator_state` over plain lists.
- `preemption.py`: signals -> an agreed checkpoint at a batch boundary (through a save callback); progress for restarts.

This layer never imports the `Accelerator`: its checkpoint methods (`hasten.facade.checkpoints`) build a `SaveSet`.

Example:
    >>> from hasten.checkpointing import ProjectConfiguration, SAFE_WEIGHTS_NAME
    >>> SAFE_WEIGHTS_NAME
    'model.safetensors'
"""

from typing import Any

from .constants import *  # noqa: F403 - the file-name constants, at Accelerate's import path
from ..core.lazy import lazy_exports
from .constants import CUSTOM_STATE_NAME, __all__ as _constants

# name -> submodule; imported on first use, so `import hasten` / `from hasten import Accelerator` stay fast
_LAZY = {
    "CheckpointError": "commit",
    "EXIT_PREEMPTED": "preemption",
    "Preempted": "preemption",
    "ProjectConfiguration": "project",
    "load_checkpoint_in_model": "model_files",
    "capture_rng_state": "rng",
    "restore_rng_state": "rng",
    "save_accelerator_state": "plain",
    "load_accelerator_state": "plain",
}

__all__ = [*_constants, *_LAZY, "save_custom_state", "load_custom_state"]
__getattr__, _ = lazy_exports(__name__, _LAZY, globals())


def save_custom_state(obj: Any, path: str, index: int = 0, save_on_each_node: bool = False) -> None:
    """Write ``obj.state_dict()`` to ``path/custom_checkpoint_<index>.pkl`` (what `save_state` does per registered object).

    Example:
        >>> import tempfile, torch
        >>> folder = tempfile.mkdtemp()
        >>> save_custom_state(torch.nn.Linear(1, 1), folder)
        >>> load_custom_state(torch.nn.Linear(1, 1), folder)
    """
    from ..core.saving import save

    save(obj.state_dict(), f"{path}/{CUSTOM_STATE_NAME}_{index}.pkl", safe_serialization=False)


def load_custom_state(obj: Any, path: str, index: int = 0) -> None:
    """Load ``path/custom_checkpoint_<index>.pkl`` into `obj` (read with ``weights_only=True``)."""
    import torch

    obj.load_state_dict(torch.load(f"{path}/{CUSTOM_STATE_NAME}_{index}.pkl", map_location="cpu", weights_only=True))
