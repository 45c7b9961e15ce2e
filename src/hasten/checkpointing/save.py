"""Saving a checkpoint: with every process, or by the main process alone.

Every process calling `save_state` (the usual case): each writes its part
into a staging folder, every process's outcome is gathered, the main
process writes the manifest and renames the folder into place, and an
error anywhere is raised everywhere.

The main process alone (``if accelerator.is_main_process:
accelerator.save_state(path)``, as Accelerate allows): where the main
process holds the whole state (one process, DDP), it writes everything it
holds — models, optimizers, schedulers, scaler, registered objects and its
own RNG states — and publishes, with no collective, so nothing waits for
the other processes (they keep their own RNG states on `load_state`, as
under Accelerate). Where the state is sharded (FSDP, DeepSpeed) the call
fails within seconds, saying to call `save_state` on every process. Which
case holds is found out without a collective (`handshake.py`).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from . import handshake
from .commit import CheckpointError, begin_staging, fsync_path, publish, staging_path, write_manifest
from .constants import (
    CUSTOM_STATE_NAME,
    GRADIENTS_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SAFE_WEIGHTS_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    WEIGHTS_NAME,
)
from .jsonable import encode
from .model_files import write_weights
from .project import ProjectConfiguration, checkpoints_root, rotate_checkpoints
from .saveset import CheckpointEngine, SaveSet
from .state import agree, all_gather, barrier, indexed_name, model_format, needs_every_process

__all__ = ["save_checkpoint", "target_dir"]

_OP = "save_state"
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_ENGINES = {"fsdp": "FSDP", "deepspeed": "DeepSpeed"}


def target_dir(config: ProjectConfiguration, output_dir: str | None) -> tuple[Path, bool]:
    """Where to save, and whether it is an automatic (rotated) checkpoint."""
    if output_dir is not None:
        return Path(output_dir), False
    if not config.automatic_checkpoint_naming:
        raise ValueError(
            "save_state() needs a directory: pass save_state(output_dir) or create the Accelerator with "
            "ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)."
        )
    target = checkpoints_root(config) / f"checkpoint_{config.iteration}"
    if target.exists():
        raise CheckpointError(
            f"{target} already exists; set accelerator.project_configuration.iteration past it, "
            "or call load_state() first to continue from it."
        )
    return target, True


def save_checkpoint(saveset: SaveSet, output_dir: str | None = None, safe_serialization: bool = True) -> Path:
    """Write a complete, atomically published checkpoint of `saveset`; returns its path (see the module doc for who writes what)."""
    process = saveset.process
    n = process.world
    if n == 1:
        return _save(saveset, *target_dir(saveset.project, output_dir), safe_serialization, together=False)
    # Which save this is: the directory, and the script's lines that called save_state (see handshake.decide).
    site = _user_stack()
    request: dict[str, Any] = {"dir": None if output_dir is None else os.path.abspath(output_dir), "site": site}
    if not process.is_main:
        reply = handshake.join(process.rank, request)
        if reply["mode"] == "error":
            raise CheckpointError(reply["error"])
        if reply["mode"] == "alone":  # some other process did not call save_state: the main process saved alone
            return Path(reply["target"])
        return _save(saveset, Path(reply["target"]), reply["automatic"], safe_serialization, together=True,
                     iteration=reply["iteration"])

    decision = handshake.decide(n, site)
    try:
        mismatched = [f"process {r} gave {req['dir'] or 'none (automatic naming)'}"
                      for r, req in sorted(decision.joined.items()) if req["dir"] != request["dir"]]
        if mismatched:
            raise CheckpointError(f"save_state was given {request['dir'] or 'no directory (automatic naming)'} on the "
                                  f"main process but {', '.join(mismatched)}; pass the same output_dir on every process.")
        target, automatic = target_dir(saveset.project, output_dir)
        if not decision.everyone and needs_every_process(saveset.engine):
            raise CheckpointError(_needs_everyone(saveset.engine, decision))
    except ValueError as failure:  # CheckpointError too: every process that called save_state raises it
        handshake.answer(decision, {"mode": "error", "error": str(failure)})
        raise
    iteration = saveset.project.iteration
    if decision.everyone:
        handshake.answer(decision, {"mode": "together", "target": str(target), "automatic": automatic,
                                    "iteration": iteration})
        return _save(saveset, target, automatic, safe_serialization, together=True, iteration=iteration)
    try:
        path = _save(saveset, target, automatic, safe_serialization, together=False)
    except Exception as failure:
        handshake.answer(decision, {"mode": "error", "error": f"the main process could not save {target}: {failure}"})
        raise
    handshake.answer(decision, {"mode": "alone", "target": str(path)})
    return path


def _user_stack(limit: int = 8) -> list[str]:
    """file:line of the script's frames that lead to this save_state call, innermost first (hasten's left out)."""
    frame: Any = sys._getframe(1)
    sites: list[str] = []
    while frame is not None and len(sites) < limit:
        name = frame.f_code.co_filename
        if not os.path.abspath(name).startswith(_PACKAGE_DIR):
            sites.append(f"{name}:{frame.f_lineno}")
        frame = frame.f_back
    return sites


def _needs_everyone(strategy: CheckpointEngine, decision: handshake.Decision) -> str:
    engine = _ENGINES.get(strategy.name, strategy.name)
    where = "; ".join(why for _, why in sorted(decision.absent.items()))
    return (f"save_state needs every process under {engine}, which holds the state in shards, but only some called "
            f"it ({where}); call accelerator.save_state(...) on every process, not only inside "
            "`if accelerator.is_main_process:`.")


def _write(directory: Path, name: str, obj: Any) -> tuple[str, int]:
    path = directory / name
    torch.save(obj, path)
    fsync_path(path)
    return name, path.stat().st_size


def _write_model(directory: Path, name: str, tensors: dict[str, torch.Tensor], safe: bool) -> tuple[str, int]:
    path = directory / name
    write_weights(tensors, path, safe)
    fsync_path(path)
    return name, path.stat().st_size


def _write_files(saveset: SaveSet, staging: Path, publisher: bool, weights: list[dict[str, torch.Tensor]],
                 optimizer_states: list[dict[str, Any]], safe: bool) -> dict[str, int]:
    """This process's files (the publisher writes the shared ones); returns {name: size}."""
    strategy = saveset.engine
    models = list(saveset.models)
    rank = saveset.process.rank
    files: dict[str, int] = {}
    staging.mkdir(parents=True, exist_ok=True)  # a process on another machine without a shared disk
    if strategy.writes_own_checkpoint_files:  # each process writes its own shard of every model and optimizer
        files.update(strategy.save_checkpoint_files(staging, models, saveset.optimizers))
    if publisher:
        model_base = SAFE_WEIGHTS_NAME if safe else WEIGHTS_NAME
        for i, weight in enumerate(weights):
            files.update([_write_model(staging, indexed_name(model_base, i), weight, safe)])
        for i, optimizer_state in enumerate(optimizer_states):
            files.update([_write(staging, indexed_name(f"{OPTIMIZER_NAME}.bin", i), optimizer_state)])
        for i, scheduler in enumerate(saveset.schedulers):
            files.update([_write(staging, indexed_name(f"{SCHEDULER_NAME}.bin", i), scheduler.state_dict())])
        if saveset.scaler is not None:
            files.update([_write(staging, SCALER_NAME, saveset.scaler.state_dict())])
        for i, obj in enumerate(saveset.custom):
            files.update([_write(staging, f"{CUSTOM_STATE_NAME}_{i}.pkl", obj.state_dict())])
    rng = {**saveset.capture_rng(), "step": saveset.counter.step}  # "step" where Accelerate keeps it
    files.update([_write(staging, f"{RNG_STATE_NAME}_{rank}.pkl", rng)])
    # Mid-accumulation, the gradients gathered so far are state too (and differ per process).
    gradients = {f"{i}.{name}": grad for i, model in enumerate(models)
                 for name, grad in strategy.model_gradients(model).items()}
    if gradients:
        files.update([_write_model(staging, f"{GRADIENTS_NAME}_{rank}.safetensors", gradients, True)])
    return files


def _save(saveset: SaveSet, target: Path, automatic: bool, safe_serialization: bool, together: bool,
          iteration: int | None = None) -> Path:
    """Write and publish `target`; `together`: every process takes part (and agrees), else this process alone."""
    process = saveset.process
    n = process.world if together else 1  # the processes that take part
    config = saveset.project
    iteration = config.iteration if iteration is None else iteration
    if not together:
        publisher = True
    else:
        publisher = process.is_local_main if config.save_on_each_node else process.is_main
    error = None
    if publisher:
        try:
            begin_staging(target)
        except (CheckpointError, OSError) as failure:
            error = str(failure)
    agree(error, n, _OP)
    staging = staging_path(target)

    strategy = saveset.engine
    models = list(saveset.models)
    sharded = strategy.writes_own_checkpoint_files
    # Every process asks the strategy (a sharded one gathers); only the main process gets full values back.
    weights = [] if sharded else [strategy.model_state_dict(model) for model in models]
    optimizer_states = [] if sharded else [strategy.optimizer_state_dict(opt) for opt in saveset.optimizers]
    for hook in saveset.save_pre_hooks:
        hook(models, weights, str(staging))  # a hook may pop weights it saves itself (e.g. save_pretrained)
    files: dict[str, int] = {}
    error = None
    try:
        files = _write_files(saveset, staging, publisher, weights, optimizer_states, safe_serialization)
    except Exception as failure:  # noqa: BLE001 - reported to every process, then raised everywhere
        error = f"writing the checkpoint failed: {type(failure).__name__}: {failure}"
    reports = all_gather((error, files), n, _OP)
    first_error = next((e for e, _ in reports if e is not None), None)
    if first_error is None and publisher:
        all_files = {name: size for _, part in reports for name, size in part.items()}
        try:
            write_manifest(staging, {
                "iteration": iteration if automatic else None,
                "num_processes": process.world,
                "saved_by": list(range(process.world)) if together else [process.rank],
                "step": saveset.counter.step,
                "files": all_files,
                "contents": {"models": len(models) if sharded else len(weights), "optimizers": len(saveset.optimizers),
                             "schedulers": len(saveset.schedulers), "dataloaders": len(saveset.dataloaders),
                             "custom": len(saveset.custom), "scaler": saveset.scaler is not None,
                             "model_format": model_format(strategy, safe_serialization)},
                "dataloaders": [encode(loader.state_dict()) for loader in saveset.dataloaders],
            })
            publish(staging, target)
        except (OSError, TypeError) as failure:
            first_error = f"publishing the checkpoint failed: {failure}"
    if first_error is not None and publisher:
        shutil.rmtree(staging, ignore_errors=True)  # the previous checkpoint, if any, is untouched
    agree(first_error, n, _OP)  # every process knows the outcome before going on
    if automatic and publisher:
        rotate_checkpoints(target.parent, config.total_limit, keep=target)
    config.iteration = iteration + 1  # as Accelerate: every save counts, named automatically or not
    barrier(n, _OP)
    return target
