"""Reading a checkpoint folder written by Accelerate's own `save_state`, so a run can switch libraries mid-training.

Accelerate writes, with no manifest: ``model.safetensors`` (or
``pytorch_model.bin``; ``_1``, ``_2`` ... for more models),
``optimizer.bin``, ``scheduler.bin``, ``scaler.pt``,
``random_states_<rank>.pkl`` (Python, NumPy and torch RNG states plus the
accumulation ``step``) and ``custom_checkpoint_<i>.pkl``. hasten reads each
into the same `CheckpointContents` its own checkpoints give, checked the
same way (keys, shapes, counts) before anything changes.

What maps, and what does not:

- weights, optimizer, scheduler, GradScaler, registered objects, each
  process's RNG states and the ``step``: restored as Accelerate would;
- a loader's position: Accelerate keeps none (a script skips batches with
  ``skip_first_batches``), so the loaders are left as they are, except a
  loader prepared with ``use_stateful_dataloader=True``, which takes its
  torchdata state (``dl_state_dict.bin``) as Accelerate's does; other
  loader files (``sampler.bin``) are not read, which load_state says once;
- sharded models (Accelerate's FSDP ``pytorch_model_fsdp_*`` or
  DeepSpeed's folders): refused in one sentence (merge them into full
  weights first).

Pickled files are read with ``weights_only=True`` (NumPy arrays allowed, as
Accelerate's own `load` allows them); a file that needs more (Accelerate
reads registered objects with ``weights_only=False``) is refused, naming
the file and ``load_state(..., load_kwargs={"weights_only": False})``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from .commit import CheckpointError
from .constants import (
    CHECKPOINT_PREFIX,
    CUSTOM_STATE_NAME,
    LOADER_STATE_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SAFE_WEIGHTS_NAME,
    SAMPLER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    WEIGHTS_NAME,
)
from .contents import CheckpointContents, ReadOptions, check_model, check_optimizer, fill_tied
from .model_files import read_weights_file
from .saveset import SaveSet
from .state import indexed_name, needs_every_process

__all__ = ["read_accelerate_checkpoint", "rng_from_accelerate"]

_CUSTOM = re.compile(rf"^{CUSTOM_STATE_NAME}_\d+\.pkl$")
_RNG = re.compile(rf"^{RNG_STATE_NAME}_(\d+)\.pkl$")


def rng_from_accelerate(states: dict[str, Any]) -> dict[str, Any]:
    """Accelerate's RNG file (NumPy's state as an array) in the form `restore_rng_state` takes.

    Example:
        >>> import numpy as np, random
        >>> saved = {"random_state": random.getstate(), "numpy_random_seed": np.random.get_state(),
        ...          "torch_manual_seed": torch.get_rng_state(), "step": 3}
        >>> sorted(rng_from_accelerate(saved))
        ['numpy_random_seed', 'random_state', 'step', 'torch_manual_seed']
    """
    kind, keys, position, has_gauss, gauss = states["numpy_random_seed"]
    if not isinstance(keys, torch.Tensor):
        import numpy as np

        keys = torch.from_numpy(np.asarray(keys).astype(np.int64))
    converted = {"random_state": states["random_state"], "torch_manual_seed": states["torch_manual_seed"],
                 "numpy_random_seed": (kind, keys, int(position), int(has_gauss), float(gauss))}
    for key, value in states.items():  # the step, and each device type's generators (`torch_<type>_manual_seed`)
        if key == "step" or (key.startswith("torch_") and key.endswith("_manual_seed") and key != "torch_manual_seed"):
            converted[key] = value
    return converted


def _model_file(path: Path, index: int) -> str:
    for base in (SAFE_WEIGHTS_NAME, WEIGHTS_NAME):
        if (path / indexed_name(base, index)).is_file():
            return indexed_name(base, index)
    sharded = sorted(p.name for p in path.iterdir() if p.name.startswith(("pytorch_model_fsdp", "pytorch_model"))
                     and p.is_dir())
    if sharded:
        raise CheckpointError(
            f"{path} holds model {index} as Accelerate's sharded folders ({', '.join(sharded)}), which hasten does not "
            "read; turn them into full weights first (`hasten merge-weights` or `accelerate merge-weights`)."
        )
    raise CheckpointError(f"{path} has no {indexed_name(SAFE_WEIGHTS_NAME, index)} or {indexed_name(WEIGHTS_NAME, index)} "
                          f"for model {index}; prepare the same models as the run that saved it.")


def read_accelerate_checkpoint(saveset: SaveSet, path: Path, models: list[Any],
                               options: ReadOptions) -> CheckpointContents:
    """Read and check a folder written by Accelerate's `save_state`; nothing in memory is changed."""
    strategy = saveset.engine
    if needs_every_process(strategy):
        raise CheckpointError(
            f"{path} was written by Accelerate (it has no hasten manifest); hasten reads Accelerate's checkpoints for "
            f"one process and DDP runs, not under {strategy.name}; load it in a DDP run and save_state there first."
        )
    entries = {p.name for p in path.iterdir()}
    ranks = sorted(int(m.group(1)) for m in map(_RNG.match, entries) if m)
    match = re.fullmatch(rf"{CHECKPOINT_PREFIX}(\d+)", path.name)
    manifest: dict[str, Any] = {
        "format": "accelerate", "files": {}, "contents": {}, "num_processes": len(ranks), "saved_by": ranks,
        "iteration": int(match.group(1)) if match else None, "step": None, "notes": [],
    }
    contents = CheckpointContents(path=path, manifest=manifest, foreign=True)
    for i, model in enumerate(models):
        name = _model_file(path, i)
        try:
            saved = read_weights_file(path / name) if name.endswith(".safetensors") else options.read(path, name)
        except CheckpointError:
            raise
        except Exception as error:  # noqa: BLE001
            raise CheckpointError(f"{name} in {path} cannot be read ({error}); the checkpoint is damaged.") from None
        expected = strategy.model_state_dict_shapes(model)
        fill_tied(saved, expected)  # tied weights stored once (Accelerate's files)
        check_model(name, saved, expected)
        contents.models.append((model, saved))
    for i, optimizer in enumerate(saveset.optimizers):
        name = indexed_name(f"{OPTIMIZER_NAME}.bin", i)
        saved = options.read(path, name)
        check_optimizer(name, saved, optimizer)
        contents.optimizers.append(saved)
    contents.schedulers = [options.read(path, indexed_name(f"{SCHEDULER_NAME}.bin", i))
                           for i in range(len(saveset.schedulers))]
    read: set[str] = set()
    for i, loader in enumerate(saveset.dataloaders):  # a torchdata-backed loader takes its state, as Accelerate's
        name = indexed_name(LOADER_STATE_NAME, i)
        if getattr(loader, "use_stateful_dataloader", False) and name in entries:
            contents.loader_states.append((loader, options.read(path, name)))
            read.add(name)
    unread = sorted(n for n in entries - read if n.startswith((LOADER_STATE_NAME.split(".")[0], SAMPLER_NAME)))
    if unread and saveset.dataloaders:
        manifest["notes"].append(
            f"{', '.join(unread)} in {path} (Accelerate's loader state) is not read: the data loaders start where they "
            "are; skip the batches already seen with accelerator.skip_first_batches(loader, n), or prepare them "
            "with use_stateful_dataloader=True, as the run that saved them."
        )
    if saveset.scaler is not None:
        if SCALER_NAME not in entries:
            raise CheckpointError(f"{path} has no {SCALER_NAME}, but this run scales fp16 gradients; load it in a run "
                                  "with the same mixed_precision.")
        contents.scaler = options.read(path, SCALER_NAME)
    custom = sorted(n for n in entries if _CUSTOM.match(n))
    if len(custom) != len(saveset.custom):
        raise CheckpointError(
            f"{path} holds {len(custom)} registered objects ({CUSTOM_STATE_NAME}_N.pkl) but this run registered "
            f"{len(saveset.custom)}; register the same objects, in the same order, as the run that saved it."
        )
    contents.custom = [options.read(path, f"{CUSTOM_STATE_NAME}_{i}.pkl") for i in range(len(custom))]
    rng_name = f"{RNG_STATE_NAME}_{saveset.process.rank}.pkl"
    if rng_name in entries:
        states = options.read(path, rng_name)
        try:
            contents.rng = rng_from_accelerate(states)
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"{rng_name} in {path} is not an RNG state Accelerate writes ({error}).") from None
    return contents
