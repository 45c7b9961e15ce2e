"""Accelerate's `save(obj, f, save_on_each_node, safe_serialization)`: written once per job (or once per node), atomically.

`hasten.core.saving.save` writes on whichever process calls it; this is the
function a script imports as ``accelerate.utils.save``: only the main process
writes (with ``save_on_each_node=True``, the first process of each node), and
``safe_serialization`` defaults to False (pickle through `torch.save`), as in
Accelerate 1.16. A state dict (an ``OrderedDict``) saved as safetensors
keeps each tied weight once, under its first name, as Accelerate's does.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

from ..runtime.state import PartialState
from ..core.saving import save as _write

__all__ = ["save", "writes_shared_files"]


def writes_shared_files(save_on_each_node: bool = False) -> bool:
    """Accelerate's rule for a file written once: the main process, or each machine's first with `save_on_each_node`.

    Example:
        >>> writes_shared_files()  # one process: it is the main one
        True
    """
    state = PartialState()
    return state.is_local_main_process if save_on_each_node else state.is_main_process


def save(obj: Any, f: str | os.PathLike[str], save_on_each_node: bool = False, safe_serialization: bool = False) -> None:
    """Save `obj` to `f` from the main process (the local main of each node with `save_on_each_node`), atomically.

    Example:
        >>> import tempfile, os, torch
        >>> path = os.path.join(tempfile.mkdtemp(), "state.pt")
        >>> save({"w": torch.ones(2)}, path)
        >>> torch.load(path, weights_only=True)["w"]
        tensor([1., 1.])
    """
    if not writes_shared_files(save_on_each_node):
        return
    if safe_serialization and isinstance(obj, OrderedDict):
        # imported here: big-model code is not needed until a state dict is saved (import cost is a feature)
        from ..big_modeling.model_helpers import clean_state_dict_for_safetensors

        obj = clean_state_dict_for_safetensors(obj)
    _write(obj, f, safe_serialization=safe_serialization)
