"""Accelerate's lower-level checkpoint functions, over plain lists: `save_accelerator_state`, `load_accelerator_state`.

They write and read exactly the files Accelerate's do for the same arguments
(``model.safetensors`` / ``pytorch_model.bin``, ``optimizer.bin``,
``scheduler.bin``, ``scaler.pt``, ``random_states_<process_index>.pkl`` with
the accumulation ``step``; ``dl_state_dict.bin`` for a loader that says
``use_stateful_dataloader``), in an existing folder and with no manifest:
what `Accelerator.save_state` adds (atomic publish, the manifest, hashes,
loader positions) is the facade's. So a folder from either library's
function loads with the other's, and with `Accelerator.load_state` (as
Accelerate's own folders do, `foreign.py`).

Differences kept on purpose: each file is written atomically (temp + rename);
the scaler is written by the main process only (Accelerate lets every process
write the same file); pickles are read with ``weights_only=True`` (NumPy
arrays allowed) unless ``load_kwargs={"weights_only": False}``, as
Accelerate's `load` does.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from ..big_modeling.model_helpers import clean_state_dict_for_safetensors
from .files import writes_shared_files
from ..runtime.state import PartialState
from ..core.saving import save
from .constants import (
    LOADER_STATE_NAME,
    MODEL_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SAFE_MODEL_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
)
from .foreign import rng_from_accelerate
from .model_files import write_weights
from .rng import device_rng_states, restore_rng_state
from .state import indexed_name, read_pickle

__all__ = ["save_accelerator_state", "load_accelerator_state"]

_logger = logging.getLogger("hasten")


def _rng_states(step: int) -> dict[str, Any]:
    """This process's RNG states in Accelerate's layout (NumPy's state as its own tuple, with the array)."""
    import random

    import numpy as np

    states: dict[str, Any] = {"step": step, "random_state": random.getstate(),
                              "numpy_random_seed": np.random.get_state(), "torch_manual_seed": torch.get_rng_state()}
    states.update(device_rng_states(initialised_only=False))  # as Accelerate: the device's, even before it is used
    return states


def save_accelerator_state(
    output_dir: str | os.PathLike[str],
    model_states: list[dict[str, Any]],
    optimizers: list[Any],
    schedulers: list[Any],
    dataloaders: list[Any],
    process_index: int,
    step: int,
    scaler: Any = None,
    save_on_each_node: bool = False,
    safe_serialization: bool = True,
) -> Path:
    """Write models' states, optimizers, schedulers, scaler and this process's RNG states into `output_dir`.

    Call it on every process (each writes its own RNG file; the main process,
    or each machine's with `save_on_each_node`, the shared ones). Models are
    given as state dicts (safetensors unless ``safe_serialization=False``);
    the rest are saved from their ``state_dict()``.

    Example:
        >>> import tempfile, torch
        >>> model = torch.nn.Linear(2, 2)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> folder = save_accelerator_state(tempfile.mkdtemp(), [model.state_dict()], [optimizer], [], [], 0, step=3)
        >>> sorted(p.name for p in folder.iterdir())
        ['model.safetensors', 'optimizer.bin', 'random_states_0.pkl']
        >>> load_accelerator_state(folder, [model], [optimizer], [], [], 0)
        {'step': 3}
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    shared = writes_shared_files(save_on_each_node)
    base = f"{SAFE_MODEL_NAME}.safetensors" if safe_serialization else f"{MODEL_NAME}.bin"
    for i, state in enumerate(model_states):
        if shared:
            if safe_serialization and isinstance(state, OrderedDict):  # a module's state_dict: tied weights once
                state = clean_state_dict_for_safetensors(state)
            write_weights(state, output_dir / indexed_name(base, i), safe_serialization)
    for prefix, objects in ((OPTIMIZER_NAME, optimizers), (SCHEDULER_NAME, schedulers)):
        for i, obj in enumerate(objects):
            state = obj.state_dict()  # on every process: a sharded optimizer's state_dict may be a collective
            if shared:
                save(state, output_dir / indexed_name(f"{prefix}.bin", i), safe_serialization=False)
    for i, loader in enumerate(dataloaders):
        if getattr(loader, "use_stateful_dataloader", False):  # every process: each holds its own position
            save(loader.state_dict(), output_dir / indexed_name(LOADER_STATE_NAME, i), safe_serialization=False)
    if scaler is not None and shared:
        save(scaler.state_dict(), output_dir / SCALER_NAME, safe_serialization=False)
    save(_rng_states(step), output_dir / f"{RNG_STATE_NAME}_{process_index}.pkl", safe_serialization=False)
    return output_dir


def load_accelerator_state(
    input_dir: str | os.PathLike[str],
    models: list[torch.nn.Module],
    optimizers: list[Any],
    schedulers: list[Any],
    dataloaders: list[Any],
    process_index: int,
    scaler: Any = None,
    map_location: str | None = None,
    load_kwargs: dict[str, Any] | None = None,
    **load_model_func_kwargs: Any,
) -> dict[str, Any]:
    """Load what `save_accelerator_state` (hasten's or Accelerate's) wrote into the live objects; returns ``{"step": n}``.

    `map_location` is ``None``/``"cpu"`` or ``"on_device"`` (this process's
    device) for the model weights; `load_model_func_kwargs` (e.g.
    ``strict=False``) go to the model loading. A missing or unreadable RNG file
    is skipped with a log line, as Accelerate does; anything else missing raises.

    Example:
        >>> import tempfile, torch
        >>> model = torch.nn.Linear(2, 2)
        >>> folder = save_accelerator_state(tempfile.mkdtemp(), [model.state_dict()], [], [], [], 0, step=0)
        >>> load_accelerator_state(folder, [torch.nn.Linear(2, 2)], [], [], [], 0)
        {'step': 0}
    """
    if map_location not in (None, "cpu", "on_device"):
        raise TypeError(f"map_location must be None, 'cpu' or 'on_device', not {map_location!r}.")
    device = PartialState().device if map_location == "on_device" else torch.device("cpu")
    trust = (load_kwargs or {}).get("weights_only") is False
    path = Path(input_dir)
    for i, model in enumerate(models):
        safe = path / indexed_name(f"{SAFE_MODEL_NAME}.safetensors", i)
        if safe.exists():
            from safetensors.torch import load_model

            # safetensors' own loader: it accepts files whose tied duplicates were dropped (Accelerate's)
            load_model(model, safe, device=str(device), **load_model_func_kwargs)
        else:
            state = torch.load(path / indexed_name(f"{MODEL_NAME}.bin", i), map_location=device, weights_only=not trust)
            model.load_state_dict(state, **load_model_func_kwargs)
    for prefix, objects in ((OPTIMIZER_NAME, optimizers), (SCHEDULER_NAME, schedulers)):
        for i, obj in enumerate(objects):
            obj.load_state_dict(read_pickle(path, indexed_name(f"{prefix}.bin", i), trust=trust))
    for i, loader in enumerate(dataloaders):
        name = indexed_name(LOADER_STATE_NAME, i)
        if getattr(loader, "use_stateful_dataloader", False) and (path / name).exists():
            loader.load_state_dict(read_pickle(path, name, trust=trust))
    if scaler is not None:
        scaler.load_state_dict(read_pickle(path, SCALER_NAME, trust=trust))
    overrides: dict[str, Any] = {}
    rng_name = f"{RNG_STATE_NAME}_{process_index}.pkl"
    try:
        states = read_pickle(path, rng_name, trust=trust)
        if "step" in states:
            overrides["step"] = states["step"]
        restore_rng_state(rng_from_accelerate(states))
    except Exception as error:  # noqa: BLE001 - Accelerate goes on without the RNG states too
        _logger.info("could not load the random states from %s (%s)", path / rng_name, error)
    return overrides
