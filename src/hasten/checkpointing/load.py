"""Loading a checkpoint: read and check *everything* first, agree across processes, only then change anything.

Every process reads what it needs (files, sizes, keys, shapes, counts),
every process learns whether all of them succeeded, and only then are the
live objects changed — so a bad checkpoint leaves the run as it was. A
folder written by Accelerate itself (no hasten manifest) is read by
`foreign.py` into the same `CheckpointContents` (`contents.py`).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any, Callable

from ..core.errors import CheckpointCorrupted
from . import background
from .commit import CheckpointError, check_files, is_checkpoint, read_manifest, resolve_complete
from .constants import (
    CUSTOM_STATE_NAME,
    GRADIENTS_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SAFE_WEIGHTS_NAME,
    SAMPLER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    WEIGHTS_NAME,
)
from .contents import CheckpointContents, ReadOptions, check_model, check_optimizer, fill_tied
from .foreign import read_accelerate_checkpoint
from .integrity import Hashes, check_hashes, start_checking
from ..core.jsonable import decode
from .model_files import read_weights_file
from .project import ProjectConfiguration, checkpoints_root, latest_checkpoint, list_checkpoints
from .saveset import SaveSet, run_load_hooks
from .state import SHARDED_FORMAT, agree, all_gather, barrier, indexed_name

__all__ = ["load_checkpoint", "read_checkpoint", "apply_checkpoint", "resolve_load_dir"]

_OP = "load_state"
_logger = logging.getLogger("hasten")


def _check_count(manifest: dict[str, Any], what: str, now: int) -> None:
    saved = manifest["contents"].get(what, 0)
    if saved != now:
        raise CheckpointError(
            f"the checkpoint holds {saved} {what} but this run prepared {now}; prepare (and register) the same objects, "
            "in the same order, as the run that saved it."
        )


def resolve_load_dir(config: ProjectConfiguration, input_dir: str | None) -> Path | None:
    """The checkpoint `load_state` would load: the given one, else the newest complete automatic one (None if none yet)."""
    if input_dir is not None:
        return resolve_complete(Path(input_dir).expanduser())
    if not config.automatic_checkpoint_naming:
        raise ValueError(
            "load_state() needs a directory: pass load_state(input_dir) or create the Accelerator with "
            "ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)."
        )
    return latest_checkpoint(checkpoints_root(config))


def read_checkpoint(saveset: SaveSet, path: Path, restore_position: bool,
                    options: ReadOptions | None = None) -> CheckpointContents:
    """Read and check everything this process needs from `path`; nothing in memory is changed."""
    options = options or ReadOptions()
    models = run_load_hooks(saveset, str(path))  # a hook may pop models it loads itself (e.g. from_pretrained)
    if not is_checkpoint(path):
        return read_accelerate_checkpoint(saveset, path, models, options)
    manifest = read_manifest(path)
    contents = CheckpointContents(path=path, manifest=manifest)
    strategy = saveset.engine
    _check_count(manifest, "models", len(models))
    _check_count(manifest, "optimizers", len(saveset.optimizers))
    _check_count(manifest, "schedulers", len(saveset.schedulers))
    _check_count(manifest, "dataloaders", len(saveset.dataloaders))
    _check_count(manifest, "custom", len(saveset.custom))
    saved_format = manifest["contents"].get("model_format", "safetensors")
    sharded = saved_format.startswith(SHARDED_FORMAT)
    if sharded and saved_format[len(SHARDED_FORMAT):] not in strategy.reads_sharded_from:
        saver = saved_format[len(SHARDED_FORMAT):]
        # `hasten merge-weights` reads FSDP's DCP folders; other engines' files are read back by the engine itself
        full = ("turn it into full weights first with `hasten merge-weights`" if saver == "fsdp" else
                f"write full weights from a {saver} run with accelerator.save_model after load_state")
        raise CheckpointError(f"{path} holds models sharded by {saver}, but this run uses {strategy.name}; "
                              f"load it under {saver} (any number of processes), or {full}.")
    model_base = SAFE_WEIGHTS_NAME if saved_format == "safetensors" else WEIGHTS_NAME
    legacy_samplers = "dataloaders" not in manifest  # older hasten checkpoints kept loader positions in sampler.bin
    names = [] if sharded else [indexed_name(model_base, i) for i in range(len(models))]
    names += [] if sharded else [indexed_name(f"{OPTIMIZER_NAME}.bin", i) for i in range(len(saveset.optimizers))]
    names += [indexed_name(f"{SCHEDULER_NAME}.bin", i) for i in range(len(saveset.schedulers))]
    if legacy_samplers:
        names += [indexed_name(f"{SAMPLER_NAME}.bin", i) for i in range(len(saveset.dataloaders))]
    names += [f"{CUSTOM_STATE_NAME}_{i}.pkl" for i in range(len(saveset.custom))]
    if saveset.scaler is not None and manifest["contents"].get("scaler"):
        names.append(SCALER_NAME)
    if manifest.get("shared") is False and names:  # a directory of its own per process; the shared files went elsewhere
        raise CheckpointError(
            f"{path} holds only what process(es) {manifest.get('saved_by')} keep for themselves (random state, data "
            "loader positions): save_state was given a different directory on each process, and the shared files "
            f"({names[0]}, ...) went to the main process's; pass that directory to load_state on every process.")
    grads_name = f"{GRADIENTS_NAME}_{saveset.process.rank}.safetensors"
    rng_name = f"{RNG_STATE_NAME}_{saveset.process.rank}.pkl"
    own = [name for name in (grads_name, rng_name) if name in manifest["files"]]  # this process's, if it saved
    check_files(path, manifest, names + own)
    if sharded:  # every file any process wrote must be whole before any process reads its part (a collective)
        check_files(path, manifest, list(manifest["files"]))
        _check_shards(saveset, path, manifest)
        hashes = None
    else:  # hashed on a helper thread while this one deserializes the same (cached) bytes
        hashes = start_checking(path, manifest, names + own)
    try:
        _read_files(saveset, contents, models, names, restore_position, options, sharded, model_base, legacy_samplers)
        check_hashes(path, manifest, hashes)
    except CheckpointCorrupted:
        raise
    except CheckpointError:
        _damage_first(path, manifest, hashes)  # a file whose bytes changed explains a failed read best
        raise
    finally:
        if hashes is not None:
            hashes.close()
    return contents


def _check_shards(saveset: SaveSet, path: Path, manifest: dict[str, Any]) -> None:
    """Each process hashes its share of every process's shard files (1/N of the checkpoint, not all of it), and all
    learn the verdict before the engine's collective read, so a damaged shard stops every process alike."""
    rank, n = saveset.process.rank, saveset.process.world
    share = [name for i, name in enumerate(sorted(manifest["files"])) if i % n == rank]
    failure = None
    try:
        check_hashes(path, manifest, start_checking(path, manifest, share))
    except CheckpointCorrupted as damaged:
        failure = damaged
    found = next((verdict for verdict in all_gather(failure, n, _OP) if verdict is not None), None)
    if found is not None:
        raise found.with_traceback(None)


def _damage_first(path: Path, manifest: dict[str, Any], hashes: Hashes | None) -> None:
    try:
        check_hashes(path, manifest, hashes)
    except CheckpointCorrupted as damaged:
        raise damaged from None


def _read_files(saveset: SaveSet, contents: CheckpointContents, models: list[Any], names: list[str],
                restore_position: bool, options: ReadOptions, sharded: bool, model_base: str,
                legacy_samplers: bool) -> None:
    """Deserialize and check this process's part of a hasten checkpoint into `contents` (nothing live changes)."""
    path, manifest, strategy = contents.path, contents.manifest, saveset.engine
    if sharded:
        try:
            contents.sharded = strategy.read_checkpoint_files(path, models, saveset.optimizers)
        except CheckpointError:
            raise
        except Exception as error:  # noqa: BLE001 - a damaged or mismatched shard: say which
            raise CheckpointError(f"the sharded models in {path} cannot be read ({type(error).__name__}: {error}).") from None
    for i, model in enumerate([] if sharded else models):
        name = indexed_name(model_base, i)
        try:
            saved = read_weights_file(path / name)
        except Exception as error:  # noqa: BLE001
            raise CheckpointCorrupted(f"{name} in {path} cannot be read ({error}); the checkpoint is damaged.") from None
        expected = strategy.model_state_dict_shapes(model)
        fill_tied(saved, expected)  # tied weights stored once (Accelerate's files)
        check_model(name, saved, expected)
        contents.models.append((model, saved))
    for i, optimizer in enumerate([] if sharded else saveset.optimizers):
        name = indexed_name(f"{OPTIMIZER_NAME}.bin", i)
        saved = options.read(path, name)
        check_optimizer(name, saved, optimizer)
        contents.optimizers.append(saved)
    contents.schedulers = [options.read(path, indexed_name(f"{SCHEDULER_NAME}.bin", i))
                           for i in range(len(saveset.schedulers))]
    for i, loader in enumerate(saveset.dataloaders):
        saved = (options.read(path, indexed_name(f"{SAMPLER_NAME}.bin", i)) if legacy_samplers
                 else decode(manifest["dataloaders"][i]))
        try:  # the checks load_state_dict would fail on, made now, before anything changes
            if restore_position:
                loader.batches_to_skip(saved)
            if loader.order is not None and saved.get("order") is not None:
                loader.order.check_state(saved["order"])
        except ValueError as error:
            raise CheckpointError(f"data loader {i}: {error}") from None
        contents.dataloaders.append(saved)
    if SCALER_NAME in names:
        contents.scaler = options.read(path, SCALER_NAME)
    contents.custom = [options.read(path, f"{CUSTOM_STATE_NAME}_{i}.pkl") for i in range(len(saveset.custom))]
    grads_name = f"{GRADIENTS_NAME}_{saveset.process.rank}.safetensors"
    if grads_name in manifest["files"]:
        contents.gradients = read_weights_file(path / grads_name)
        saved_world = manifest.get("num_processes", saveset.process.world)
        if saved_world != saveset.process.world and any(bool(g.any()) for g in contents.gradients.values()):
            # a partial sum over those processes' share of the cycle: no sharing of it sums to this run's gradients
            raise CheckpointError(
                f"{path} was saved by {saved_world} processes in the middle of a gradient accumulation cycle, whose "
                f"partial gradients belong to those processes; resume it on {saved_world} processes, or from a "
                "checkpoint saved right after an optimizer step.")
        for i, model in enumerate(models):
            shapes = {f"{i}.{k}": v for k, v in strategy.model_state_dict_shapes(model).items()}
            for key, grad in contents.gradients.items():
                if key.startswith(f"{i}.") and (key not in shapes or shapes[key].shape != grad.shape):
                    raise CheckpointError(f"{grads_name} does not fit model {i}: {key} has no parameter of that shape.")
    rng_name = f"{RNG_STATE_NAME}_{saveset.process.rank}.pkl"
    if rng_name in manifest["files"]:
        contents.rng = options.read(path, rng_name)


def apply_checkpoint(saveset: SaveSet, contents: CheckpointContents) -> None:
    """Put checked contents into the live objects (after every process agreed they are fine)."""
    strategy = saveset.engine
    if contents.sharded is not None:
        strategy.apply_checkpoint_files(contents.sharded)
    for model, saved in contents.models:
        strategy.load_model_state_dict(model, saved)
    saved_by = contents.manifest.get("saved_by")
    # Gradients saved mid-accumulation are this process's own; Accelerate saves none, nor does a main-only save
    # for the other processes: those keep theirs.
    if not contents.foreign and (saved_by is None or saveset.process.rank in saved_by):
        for i, model in enumerate(saveset.models):
            prefix = f"{i}."
            strategy.load_model_gradients(model, {k[len(prefix):]: v for k, v in contents.gradients.items()
                                                  if k.startswith(prefix)})
    for optimizer, saved in zip(saveset.optimizers, contents.optimizers):
        strategy.load_optimizer_state_dict(optimizer, saved)
    for scheduler, saved in zip(saveset.schedulers, contents.schedulers):
        scheduler.load_state_dict(saved)
    for loader, saved in zip(saveset.dataloaders, contents.dataloaders):
        loader.load_position(saved, restore_position=saveset.restore_position)
    for loader, state in contents.loader_states:
        loader.load_state_dict(state)
    if contents.scaler is not None and saveset.scaler is not None:  # read only when this run scales
        saveset.scaler.load_state_dict(contents.scaler)
    for obj, saved in zip(saveset.custom, contents.custom):
        obj.load_state_dict(saved)
    if contents.rng is not None:
        saveset.restore_rng(contents.rng)
    step = contents.rng.get("step") if contents.foreign and contents.rng else contents.manifest.get("step")
    if step is not None:
        saveset.counter.step = _step_in_this_run(int(step), contents.manifest.get("gradient_accumulation_steps"),
                                                 getattr(saveset.counter, "num_steps", None))
    iteration = contents.manifest.get("iteration")
    if iteration is not None and saveset.project.automatic_checkpoint_naming:
        saveset.project.iteration = iteration + 1


def _step_in_this_run(step: int, saved_accumulation: int | None, accumulation: int | None) -> int:
    """The accumulation count after a load: the same number of optimizer steps, counted in this run's cycles.

    A run that accumulates another number of batches (an elastic run on
    another number of processes keeps its global batch that way) resumes at
    the start of its next cycle; a count inside a cycle stays as saved.

    Example:
        >>> _step_in_this_run(6, 1, 2), _step_in_this_run(6, 2, 2), _step_in_this_run(5, 2, 4)
        (12, 6, 5)
    """
    if not saved_accumulation or not accumulation or saved_accumulation == accumulation or step % saved_accumulation:
        return step
    return step // saved_accumulation * accumulation


def _same(path: Path) -> Path | None:
    return path


def _earlier_checkpoint(path: Path) -> Path | None:
    """The newest complete automatic checkpoint older than `path` (None: there is none)."""
    older = [candidate for _, candidate in list_checkpoints(path.parent)]
    return older[older.index(path) - 1] if path in older and older.index(path) > 0 else None


def _read_agreed(saveset: SaveSet, locate: Callable[[], Path | None], options: ReadOptions
                 ) -> tuple[Path | None, CheckpointContents | None, list[CheckpointError]]:
    """Every process finds and reads a checkpoint; returns its path, this process's contents, and every process's
    error (the same list on every process, so all decide alike)."""
    error, contents, path = None, None, None
    try:
        path = locate()
        if path is not None:
            contents = read_checkpoint(saveset, path, saveset.restore_position, options)
    except CheckpointError as failure:
        error = failure
    n = saveset.process.world
    errors = all_gather(error, n, _OP)
    prefixed = [type(e)(("" if n == 1 else f"on process {rank}: ") + str(e)) for rank, e in enumerate(errors) if e is not None]
    return path, contents, prefixed


def load_checkpoint(saveset: SaveSet, input_dir: str | None = None,
                    on_missing_rng: Callable[[str], None] | None = None,
                    load_kwargs: dict[str, Any] | None = None) -> Path | None:
    """Check, agree, then restore everything in `saveset`; returns the checkpoint loaded (None: automatic naming, none yet).

    With ``ProjectConfiguration(fallback_on_damage=True)`` and no `input_dir`, a newest checkpoint that any
    process finds damaged (`CheckpointCorrupted`) is passed over for the newest complete one before it, with a warning.
    """
    background.wait_pending()  # an asynchronous save still writing: it may be the very checkpoint asked for
    n = saveset.process.world
    options = ReadOptions.from_load_kwargs(load_kwargs)
    path, contents, errors = _read_agreed(saveset, lambda: resolve_load_dir(saveset.project, input_dir), options)
    damaged: list[tuple[Path, CheckpointError]] = []
    fallback = input_dir is None and saveset.project.fallback_on_damage
    while errors and fallback and path is not None and all(isinstance(e, CheckpointCorrupted) for e in errors):
        earlier = _earlier_checkpoint(path)
        if earlier is None:
            break
        damaged.append((path, errors[0]))
        path, contents, errors = _read_agreed(saveset, functools.partial(_same, earlier), options)
    if errors:
        raise errors[0]
    # A directory per process is fine where each was saved so (`layout.py`) or by Accelerate, and named explicitly.
    own = input_dir is not None and contents is not None and (contents.foreign or bool(contents.manifest.get("split")))
    found = all_gather((None if path is None else str(path), own), n, _OP)
    if len({where for where, _ in found}) > 1 and not all(own for _, own in found):
        found = [where for where, _ in found]
        raise CheckpointError(f"the processes found different checkpoints to resume from ({found}); use a shared disk "
                              "or pass the same input_dir on every process.")
    if contents is None:
        return None
    if damaged and saveset.process.is_main:
        for bad, why in damaged:
            _logger.warning("hasten: %s is damaged, so load_state() loads the previous complete checkpoint %s "
                            "instead (fallback_on_damage=True); what was found: %s", bad, path, why)
    if on_missing_rng is not None and saveset.process.is_main:
        for note in contents.manifest.get("notes", []):
            on_missing_rng(note)
    if contents.rng is None and on_missing_rng is not None:
        saved_by = contents.manifest.get("saved_by")
        alone = saved_by == [0] and contents.manifest.get("num_processes", 1) > 1  # a run of N saved by process 0 only
        who = ("the main process alone" if alone else "1 process" if saved_by == [0] else
               f"processes {saved_by}" if saved_by is not None else f"{contents.manifest.get('num_processes')} processes")
        on_missing_rng(f"{contents.path} has no RNG state for process {saveset.process.rank} (it was saved by "
                       f"{who}); this process keeps its own random state.")
    apply_checkpoint(saveset, contents)
    if damaged:  # the next automatic save goes past the damaged checkpoints, which stay on disk to be looked at
        newest = int(damaged[0][0].name.rpartition("_")[2])
        saveset.project.iteration = max(saveset.project.iteration, newest + 1)
    barrier(n, _OP)
    return contents.path
