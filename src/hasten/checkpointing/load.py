"""Loading a checkpoint: read and check *everything* first, agree across processes, only then change anything.

Every process reads what it needs (files, sizes, keys, shapes, counts),
every process learns whether all of them succeeded, and only then are the
live objects changed — so a bad checkpoint leaves the run as it was. A
folder written by Accelerate itself (no hasten manifest) is read by
`foreign.py` into the same `CheckpointContents` (`contents.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

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
from .contents import CheckpointContents, ReadOptions, check_model, check_optimizer
from .foreign import read_accelerate_checkpoint
from .jsonable import decode
from .model_files import read_weights_file
from .project import ProjectConfiguration, checkpoints_root, latest_checkpoint
from .saveset import SaveSet
from .state import SHARDED_FORMAT, agree, all_gather, barrier, indexed_name, model_format

__all__ = ["load_checkpoint", "read_checkpoint", "apply_checkpoint", "resolve_load_dir"]

_OP = "load_state"


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
    models = list(saveset.models)
    for hook in saveset.load_pre_hooks:
        hook(models, str(path))  # a hook may pop models it loads itself (e.g. from_pretrained)
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
    if sharded and saved_format != model_format(strategy, True):
        raise CheckpointError(
            f"{path} holds models sharded by {saved_format[len(SHARDED_FORMAT):]}, but this run uses {strategy.name}; "
            f"load it under the same strategy, or turn it into full weights first with `hasten merge-weights`."
        )
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
    check_files(path, manifest, names)

    if sharded:  # every file any process wrote must be whole before any process reads its part
        check_files(path, manifest, list(manifest["files"]))
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
            raise CheckpointError(f"{name} in {path} cannot be read ({error}); the checkpoint is damaged.") from None
        check_model(name, saved, strategy.model_state_dict_shapes(model))
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
        check_files(path, manifest, [grads_name])
        contents.gradients = read_weights_file(path / grads_name)
        for i, model in enumerate(models):
            shapes = {f"{i}.{k}": v for k, v in strategy.model_state_dict_shapes(model).items()}
            for key, grad in contents.gradients.items():
                if key.startswith(f"{i}.") and (key not in shapes or shapes[key].shape != grad.shape):
                    raise CheckpointError(f"{grads_name} does not fit model {i}: {key} has no parameter of that shape.")
    rng_name = f"{RNG_STATE_NAME}_{saveset.process.rank}.pkl"
    if (path / rng_name).is_file():
        check_files(path, manifest, [rng_name])
        contents.rng = options.read(path, rng_name)
    return contents


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
        loader.load_state_dict(saved, restore_position=saveset.restore_position)
    if contents.scaler is not None and saveset.scaler is not None:  # read only when this run scales
        saveset.scaler.load_state_dict(contents.scaler)
    for obj, saved in zip(saveset.custom, contents.custom):
        obj.load_state_dict(saved)
    if contents.rng is not None:
        saveset.restore_rng(contents.rng)
    step = contents.rng.get("step") if contents.foreign and contents.rng else contents.manifest.get("step")
    if step is not None:
        saveset.counter.step = int(step)
    iteration = contents.manifest.get("iteration")
    if iteration is not None and saveset.project.automatic_checkpoint_naming:
        saveset.project.iteration = iteration + 1


def load_checkpoint(saveset: SaveSet, input_dir: str | None = None,
                    on_missing_rng: Callable[[str], None] | None = None,
                    load_kwargs: dict[str, Any] | None = None) -> Path | None:
    """Check, agree, then restore everything in `saveset`; returns the checkpoint loaded (None: automatic naming, none yet)."""
    n = saveset.process.world
    options = ReadOptions.from_load_kwargs(load_kwargs)
    error, contents, path = None, None, None
    try:
        path = resolve_load_dir(saveset.project, input_dir)
        if path is not None:
            contents = read_checkpoint(saveset, path, saveset.restore_position, options)
    except CheckpointError as failure:
        error = str(failure)
    agree(error, n, _OP)
    found = all_gather(None if path is None else str(path), n, _OP)
    if len(set(found)) > 1:
        raise CheckpointError(f"the processes found different checkpoints to resume from ({found}); use a shared disk "
                              "or pass the same input_dir on every process.")
    if contents is None:
        return None
    if on_missing_rng is not None and saveset.process.is_main:
        for note in contents.manifest.get("notes", []):
            on_missing_rng(note)
    if contents.rng is None and on_missing_rng is not None:
        saved_by = contents.manifest.get("saved_by")
        who = ("the main process alone" if saved_by == [0] else
               f"processes {saved_by}" if saved_by is not None else f"{contents.manifest.get('num_processes')} processes")
        on_missing_rng(f"{contents.path} has no RNG state for process {saveset.process.rank} (it was saved by "
                       f"{who}); this process keeps its own random state.")
    apply_checkpoint(saveset, contents)
    barrier(n, _OP)
    return contents.path
