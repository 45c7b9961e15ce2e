"""Saving a checkpoint: with every process, or by the main process alone.

Every process calling `save_state` (the usual case): each writes its part
into a staging folder, every process's outcome is gathered, the main
process writes the manifest and renames the folder into place, and an
error anywhere is raised everywhere. Given a different directory on each
process (as Accelerate allows), each directory is completed and renamed
by one of the processes saving into it: the main process's holds the
shared files, every one its processes' own (`layout.py`).

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
from typing import Any, Callable

import torch

from ..big_modeling.model_helpers import clean_state_dict_for_safetensors
from ..process.group import group_timeout
from . import background, handshake, integrity
from .snapshot import Snapshot
from .commit import CheckpointError, begin_staging, fsync_path, publish, staging_path, write_manifest
from .constants import (
    CUSTOM_STATE_NAME,
    GRADIENTS_NAME,
    LOADER_STATE_NAME,
    MANIFEST_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SAFE_WEIGHTS_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    WEIGHTS_NAME,
)
from .failures import FileWriteFailed, write_failure
from .integrity import Hashes, manifest_hashes
from ..core.jsonable import encode
from .layout import SaveLayout, split_layout
from .model_files import write_weights
from .project import ProjectConfiguration, checkpoints_root, rotate_checkpoints
from .saveset import CheckpointEngine, SaveSet, run_save_hooks
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


def save_checkpoint(saveset: SaveSet, output_dir: str | None = None, safe_serialization: bool = True,
                    async_save: bool = False, everyone: bool = False) -> Path | background.AsyncSave:
    """Write a complete, atomically published checkpoint of `saveset`; returns its path (see the module doc for who writes what).

    `everyone`: the caller knows every process calls this at the same point (hasten's periodic and preemption
    saves), so the main process need not learn who takes part (`handshake.py`): a process that is gone makes the
    save fail at once instead of after the handshake's grace.
    `async_save`: return once the state is copied; the writing and publishing
    go on in the background and the returned path is also a
    `background.AsyncSave` handle (`wait()`). A save waits for this
    process's previous asynchronous one first.
    """
    background.wait_pending()
    process = saveset.process
    n = process.world
    if n == 1:
        return _save(saveset, *target_dir(saveset.project, output_dir), safe_serialization, together=False,
                     in_background=async_save)
    if everyone:  # hasten's own saves (periodic, preemption): every process is here, no need to ask who takes part
        error: str | CheckpointError | None = None
        try:
            target, automatic = target_dir(saveset.project, output_dir)
        except ValueError as failure:  # CheckpointError too
            error = failure if isinstance(failure, CheckpointError) else str(failure)
        agree(error, n, _OP)
        return _save(saveset, target, automatic, safe_serialization, together=True,
                     iteration=saveset.project.iteration, in_background=async_save)
    # Which save this is: the directory, and the script's lines that called save_state (see handshake.decide).
    site = _user_stack()
    writer = process.is_local_main if saveset.project.save_on_each_node else process.is_main  # of the shared files
    request: dict[str, Any] = {"dir": None if output_dir is None else os.path.abspath(output_dir), "site": site,
                               "writer": writer}
    if not process.is_main:
        reply = handshake.join(process.rank, request)
        if reply["mode"] == "error":
            raise CheckpointError(reply["error"])
        if reply["mode"] == "alone":  # some other process did not call save_state: the main process saved alone
            return Path(reply["target"])
        given = SaveLayout.from_json(reply["layout"]) if reply.get("layout") else None
        target = Path(reply["target"] if given is None else given.dirs[process.rank])  # with a layout, its own
        return _save(saveset, target, reply["automatic"], safe_serialization, together=True,
                     iteration=reply["iteration"], in_background=async_save, layout=given)

    decision = handshake.decide(n, site)
    layout: SaveLayout | None = None
    try:
        if any(req["dir"] != request["dir"] for req in decision.joined.values()):  # a directory of its own each
            engine = _ENGINES.get(saveset.engine.name, saveset.engine.name)
            layout = split_layout({0: request, **decision.joined}, decision.everyone,
                                  engine if needs_every_process(saveset.engine) else None, async_save)
        target, automatic = target_dir(saveset.project, output_dir)
        if not decision.everyone and needs_every_process(saveset.engine):
            raise CheckpointError(_needs_everyone(saveset.engine, decision))
    except ValueError as failure:  # CheckpointError too: every process that called save_state raises it
        handshake.answer(decision, {"mode": "error", "error": str(failure)})
        raise
    iteration = saveset.project.iteration
    if decision.everyone:
        handshake.answer(decision, {"mode": "together", "target": str(target), "automatic": automatic,
                                    "iteration": iteration, "layout": None if layout is None else layout.to_json()})
        return _save(saveset, target, automatic, safe_serialization, together=True, iteration=iteration,
                     in_background=async_save, layout=layout)
    try:  # the main process alone (the others did not call save_state): written before returning
        path = _save(saveset, target, automatic, safe_serialization, together=False)
    except Exception as failure:
        message = str(failure) if isinstance(failure, CheckpointError) else f"the main process could not save {target}: {failure}"
        handshake.answer(decision, {"mode": "error", "error": message})
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


def _write(directory: Path, name: str, obj: Any, hashes: Hashes | None) -> tuple[str, int]:
    path = directory / name
    try:
        torch.save(obj, path)  # to the path, not to a file object: the archive inside is named as Accelerate's
        _seal(path, name, hashes)
    except Exception as failure:
        raise FileWriteFailed(name) from failure
    return name, path.stat().st_size


def _write_model(directory: Path, name: str, tensors: dict[str, torch.Tensor], safe: bool,
                 hashes: Hashes | None) -> tuple[str, int]:
    if not safe:  # straight into the staging folder, which is published atomically as a whole
        return _write(directory, name, {k: v.detach().cpu() for k, v in tensors.items()}, hashes)
    path = directory / name
    try:
        # As Accelerate: safetensors hold tied weights once, under their first name (its loader refuses the
        # duplicate); a pickle (above) keeps every name.
        write_weights(clean_state_dict_for_safetensors(dict(tensors)), path, safe)
        _seal(path, name, hashes)
    except Exception as failure:
        raise FileWriteFailed(name) from failure
    return name, path.stat().st_size


def _seal(path: Path, name: str, hashes: Hashes | None) -> None:
    """Hash the file just written (from the page cache, on the helper thread) while this thread fsyncs it."""
    if hashes is not None:
        hashes.add(name, path)
    fsync_path(path)


def _captured(saveset: SaveSet, publisher: bool, weights: list[dict[str, torch.Tensor]],
              optimizer_states: list[dict[str, Any]], take: Callable[[Any], Any] = lambda value: value,
              loader_states: bool | None = None) -> list[tuple[str, str, Any]]:
    """What this process writes besides sharded engine files, as (kind, name, value) in write order.

    `publisher`: it writes the shared files; `loader_states` (default: the
    same): it writes the torchdata loaders' states (each directory's own when
    every process saves into its own directory).

    `take`: how each value is kept (an asynchronous save's `Snapshot.take`:
    a deep copy, which keeps tensors that share storage sharing it, so the
    files are the same bytes as a synchronous save's).
    """
    rank = saveset.process.rank
    items: list[tuple[str, str, Any]] = []
    if publisher:
        for i, weight in enumerate(weights):
            items.append(("model", str(i), take(weight)))
        for i, optimizer_state in enumerate(optimizer_states):
            items.append(("object", indexed_name(f"{OPTIMIZER_NAME}.bin", i), take(optimizer_state)))
        for i, scheduler in enumerate(saveset.schedulers):
            items.append(("object", indexed_name(f"{SCHEDULER_NAME}.bin", i), take(scheduler.state_dict())))
        if saveset.scaler is not None:
            items.append(("object", SCALER_NAME, take(saveset.scaler.state_dict())))
        for i, obj in enumerate(saveset.custom):
            items.append(("object", f"{CUSTOM_STATE_NAME}_{i}.pkl", take(obj.state_dict())))
    if publisher if loader_states is None else loader_states:
        for i, loader in enumerate(saveset.dataloaders):  # Accelerate's file for a torchdata-backed loader
            if loader.use_stateful_dataloader:
                items.append(("object", indexed_name(LOADER_STATE_NAME, i), take(loader.state_dict())))
    rng = {**saveset.capture_rng(), "step": saveset.accumulation_count}  # "step" where Accelerate keeps it
    items.append(("object", f"{RNG_STATE_NAME}_{rank}.pkl", rng))  # captured fresh: nothing to copy
    # Mid-accumulation, the gradients gathered so far are state too (and differ per process).
    gradients = {} if saveset.at_step_start else {
        f"{i}.{name}": grad for i, model in enumerate(saveset.models)
        for name, grad in saveset.engine.model_gradients(model).items()}
    if gradients:
        items.append(("gradients", f"{GRADIENTS_NAME}_{rank}.safetensors", take(gradients)))
    return items


def _guarded(saveset: SaveSet, optimizer_states: list[dict[str, Any]]) -> list[torch.Tensor]:
    """The tensors only an optimizer step changes (parameters, optimizer state): an asynchronous save copies them later."""
    tensors: list[torch.Tensor] = [p for model in saveset.models for p in model.parameters()]
    for state in optimizer_states:
        for entry in state.get("state", {}).values():
            tensors.extend(v for v in (entry.values() if isinstance(entry, dict) else ()) if isinstance(v, torch.Tensor))
    return tensors


def _write_captured(staging: Path, items: list[tuple[str, str, Any]], safe: bool,
                    hashes: Hashes | None) -> dict[str, int]:
    files: dict[str, int] = {}
    model_base = SAFE_WEIGHTS_NAME if safe else WEIGHTS_NAME
    for kind, name, value in items:
        if kind == "model":
            files.update([_write_model(staging, indexed_name(model_base, int(name)), value, safe, hashes)])
        elif kind == "gradients":
            files.update([_write_model(staging, name, value, True, hashes)])
        else:
            files.update([_write(staging, name, value, hashes)])
    return files


def _finish_shards(strategy: CheckpointEngine, staging: Path, shards: Callable[[], dict[str, int]],
                   hashes: Hashes | None) -> dict[str, int]:
    """(Writer thread.) Wait for the engine's background write of this process's shards; hash what it wrote."""
    try:
        written = shards()
    except Exception as failure:
        raise FileWriteFailed(f"its {_ENGINES.get(strategy.name, strategy.name)} shards") from failure
    for name in written:
        if hashes is not None:
            hashes.add(name, staging / name)
    return written


def _write_files(saveset: SaveSet, staging: Path, publisher: bool, weights: list[dict[str, torch.Tensor]],
                 optimizer_states: list[dict[str, Any]], safe: bool, hashes: Hashes | None,
                 loader_states: bool) -> dict[str, int]:
    """This process's files (the publisher writes the shared ones); returns {name: size}, and hashes them."""
    strategy = saveset.engine
    files: dict[str, int] = {}
    staging.mkdir(parents=True, exist_ok=True)  # a process on another machine without a shared disk
    if strategy.writes_own_checkpoint_files:  # each process writes its own shard of every model and optimizer
        try:
            written = strategy.save_checkpoint_files(staging, list(saveset.models), saveset.optimizers)
        except Exception as failure:
            raise FileWriteFailed(f"its {_ENGINES.get(strategy.name, strategy.name)} shards") from failure
        files.update(written)
        for name in written:
            if hashes is not None:
                hashes.add(name, staging / name)
    files.update(_write_captured(staging, _captured(saveset, publisher, weights, optimizer_states,
                                                    loader_states=loader_states), safe, hashes))
    return files


def _save(saveset: SaveSet, target: Path, automatic: bool, safe_serialization: bool, together: bool,
          iteration: int | None = None, in_background: bool = False,
          layout: SaveLayout | None = None) -> Path | background.AsyncSave:
    """Write and publish `target`; `together`: every process takes part (and agrees), else this process alone.

    `in_background`: copy the state, then write and publish on a writer thread (`background.py`); returns its handle.
    `layout`: every process saves into a directory of its own (`layout.py`); `target` is this process's.
    """
    process = saveset.process
    n = process.world if together else 1  # the processes that take part
    config = saveset.project
    iteration = config.iteration if iteration is None else iteration
    if not together:
        publisher = True
    else:
        publisher = process.is_local_main if config.save_on_each_node else process.is_main
    # Who stages, completes and renames this process's directory, and whose files it holds.
    committer = publisher if layout is None else layout.is_committer(process.rank)
    group = (list(range(n)) if together else [process.rank]) if layout is None else layout.group(process.rank)
    error: str | CheckpointError | None = None
    if committer:
        try:
            begin_staging(target)
        except CheckpointError as failure:
            error = str(failure)
        except OSError as failure:  # e.g. a directory this process may not write
            error = write_failure(failure, target, automatic, process.rank)
    agree(error, n, _OP)
    staging = staging_path(target)

    strategy = saveset.engine
    models = list(saveset.models)
    sharded = strategy.writes_own_checkpoint_files
    # Every process asks the strategy (a sharded one gathers); only the main process gets full values back.
    weights = [] if sharded else [strategy.model_state_dict(model) for model in models]
    optimizer_states = [] if sharded else [strategy.optimizer_state_dict(opt) for opt in saveset.optimizers]
    run_save_hooks(saveset, weights, str(staging))  # a hook may pop weights it saves itself (e.g. save_pretrained)
    manifest = {
        "iteration": iteration if automatic else None,
        "num_processes": process.world,
        "saved_by": group,
        "step": saveset.accumulation_count,
        "gradient_accumulation_steps": getattr(saveset.counter, "num_steps", None),
        "contents": {"models": len(models) if sharded else len(weights), "optimizers": len(saveset.optimizers),
                     "schedulers": len(saveset.schedulers), "dataloaders": len(saveset.dataloaders),
                     "custom": len(saveset.custom), "scaler": saveset.scaler is not None,
                     "model_format": model_format(strategy, safe_serialization)},
        # each loader's own position (a torchdata-backed loader's state_dict is torchdata's: not this)
        "dataloaders": [encode(loader.position_state()) for loader in saveset.dataloaders],
    }
    if layout is not None:  # a directory per process: this one holds the shared files, or its processes' own only
        manifest.update(split=True, shared=layout.holds_shared(process.rank))
    if saveset.notes is not None:
        manifest["run"] = saveset.notes()

    def publish_outcome(reports: list[tuple[Any, dict[str, int], dict[str, str]]]) -> str | CheckpointError | None:
        """The publisher's part once every process reported: manifest, rename, rotation; the first error, if any."""
        first_error = next((e for e, _, _ in reports if e is not None), None)  # any process's: none is published
        if first_error is None and committer:
            mine = reports if layout is None else [reports[rank] for rank in group]  # the files in this directory
            all_files = {name: size for _, part, _ in mine for name, size in part.items()}
            all_digests = {name: digest for _, _, part in mine for name, digest in part.items()}
            try:
                write_manifest(staging, {**manifest, "files": all_files,
                                         **({"hashes": manifest_hashes(all_digests)} if integrity.ENABLED else {})})
                publish(staging, target)
            except (OSError, TypeError) as failure:
                first_error = write_failure(failure, target, automatic, process.rank, MANIFEST_NAME)
        if first_error is not None:
            shutil.rmtree(staging, ignore_errors=True)  # the previous checkpoint, if any, is untouched
        elif automatic and committer:
            rotate_checkpoints(target.parent, config.total_limit, keep=target)
        return first_error

    def write_mine(items: list[tuple[str, str, Any]] | None, snapshot: Snapshot | None = None,
                   shards: Callable[[], dict[str, int]] | None = None) -> tuple[Any, dict[str, int], dict[str, str]]:
        files: dict[str, int] = {}
        digests: dict[str, str] = {}
        error: CheckpointError | None = None
        hashes = Hashes() if integrity.ENABLED else None
        try:
            if items is None:
                files = _write_files(saveset, staging, publisher, weights, optimizer_states, safe_serialization, hashes,
                                     loader_states=committer)
            else:
                if snapshot is not None:
                    snapshot.finish()  # the parameters and optimizer state, copied before anything is written
                staging.mkdir(parents=True, exist_ok=True)
                if shards is not None:
                    files.update(_finish_shards(strategy, staging, shards, hashes))
                files.update(_write_captured(staging, items, safe_serialization, hashes))
            digests = hashes.result() if hashes is not None else {}
        except CheckpointError as failure:  # already one sentence (the snapshot saw the state change)
            error = failure
        except Exception as failure:  # noqa: BLE001 - reported to every process, then raised everywhere
            error = write_failure(failure, target, automatic, process.rank)  # while the disk is as the failure left it
        finally:
            if hashes is not None:
                hashes.close()
        return error, files, digests

    if in_background:
        items: list[tuple[str, str, Any]] = []
        copy_error: str | None = None
        snapshot = Snapshot(())
        shards: Callable[[], dict[str, int]] | None = None
        try:  # references and the small state now; the parameters and optimizer state on the writer thread
            # only a process that writes the parameters and optimizer state copies them (the others' buffers would
            # be memory and a copy for nothing: under DDP, every process but the main one)
            snapshot = Snapshot(_guarded(saveset, optimizer_states) if publisher else ())
            items = _captured(saveset, publisher, weights, optimizer_states, snapshot.take)
            if sharded:  # last (nothing after it can fail): the engine copies its shards now, writes them meanwhile
                staging.mkdir(parents=True, exist_ok=True)
                shards = strategy.begin_checkpoint_files(staging, models, saveset.optimizers)
        except CheckpointError as failure:  # the engine cannot save in the background: it says why
            copy_error = str(failure)
        except Exception as failure:  # noqa: BLE001 - agreed below, so no process goes on alone
            copy_error = (f"save_state(async_save=True) could not copy the state to write in the background "
                          f"({type(failure).__name__}: {failure}); make the registered objects' state_dict() "
                          "copyable (copy.deepcopy), or save without async_save.")
        if copy_error is not None and publisher:
            shutil.rmtree(staging, ignore_errors=True)
        agree(copy_error, n, _OP)
        config.iteration = iteration + 1  # counted now, as a synchronous save would have by the time it returns
        number = background.next_number()

        def work() -> None:
            try:
                error, files, digests = write_mine(items, snapshot, shards)
            finally:
                snapshot.release()
            if n == 1:
                outcome = publish_outcome([(error, files, digests)])
                if outcome is not None:
                    raise outcome if isinstance(outcome, CheckpointError) else CheckpointError(outcome)
                return
            report = (None if error is None else str(error), files, digests)
            background.exchange(number, process.rank, n, publisher, report,
                                lambda reports: _text(publish_outcome([tuple(r) for r in reports])), group_timeout())

        snapshot.arm()  # every optimizer step now waits for the copy
        return background.run_in_background(target, work)

    reports = all_gather(write_mine(None), n, _OP)
    first_error = publish_outcome(reports)
    agree(first_error, n, _OP)  # every process knows the outcome before going on
    config.iteration = iteration + 1  # as Accelerate: every save counts, named automatically or not
    barrier(n, _OP)
    return target


def _text(error: str | CheckpointError | None) -> str | None:
    return None if error is None else str(error)
