"""What a checkpoint holds, and saving / loading all of it for an `Accelerator`.

A checkpoint holds every prepared model (through the strategy, so sharded
engines can supply their own state), optimizer, scheduler, the fp16
GradScaler, each prepared DataLoader's position, each object given to
`register_for_checkpointing`, every process's RNG states, and the
accumulation step. Non-tensor files are written with `torch.save` and read
with ``weights_only=True``: nothing is unpickled from a checkpoint.

Loading first reads and checks *everything* (files, sizes, keys, shapes,
counts) on every process, agrees that all are fine, and only then changes
any in-memory object.
"""

from __future__ import annotations

import pickle
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from .commit import CheckpointError, begin_staging, check_files, fsync_path, publish, read_manifest, resolve_complete
from .commit import staging_path, write_manifest
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
from .model_files import read_weights_file, write_weights
from .project import checkpoints_root, latest_checkpoint, rotate_checkpoints
from .rng import capture_rng_state, restore_rng_state

if TYPE_CHECKING:
    from ..accelerator import Accelerator

__all__ = ["save_checkpoint", "load_checkpoint", "indexed_name", "CheckpointContents"]


def indexed_name(base: str, index: int) -> str:
    """Accelerate's naming: ``optimizer.bin``, ``optimizer_1.bin``, ``model.safetensors``, ``model_1.safetensors``.

    Example:
        >>> indexed_name("optimizer.bin", 0), indexed_name("model.safetensors", 2)
        ('optimizer.bin', 'model_2.safetensors')
    """
    if index == 0:
        return base
    stem, _, ext = base.partition(".")
    return f"{stem}_{index}.{ext}"


# -- collectives that tolerate one process ---------------------------------------------------
def _all_gather(value: Any, num_processes: int) -> list[Any]:
    if num_processes == 1:
        return [value]
    import torch.distributed as dist

    gathered: list[Any] = [None] * num_processes
    dist.all_gather_object(gathered, value)
    return gathered


def _barrier(num_processes: int) -> None:
    if num_processes > 1:
        import torch.distributed as dist

        dist.barrier()


def _agree(error: str | None, num_processes: int) -> None:
    """Raise the first process's error on every process (so no process goes on alone)."""
    errors = _all_gather(error, num_processes)
    for rank, message in enumerate(errors):
        if message is not None:
            prefix = "" if num_processes == 1 else f"on process {rank}: "
            raise CheckpointError(prefix + message)


# -- saving ----------------------------------------------------------------------------------
def _write(directory: Path, name: str, obj: Any) -> tuple[str, int]:
    path = directory / name
    torch.save(obj, path)
    fsync_path(path)
    return name, path.stat().st_size


def _write_model(directory: Path, name: str, state: dict[str, torch.Tensor], safe: bool) -> tuple[str, int]:
    path = directory / name
    write_weights(state, path, safe)
    fsync_path(path)
    return name, path.stat().st_size


def _target_dir(accelerator: "Accelerator", output_dir: str | None) -> tuple[Path, bool]:
    """Where to save, and whether it is an automatic (rotated) checkpoint."""
    config = accelerator.project_configuration
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


def save_checkpoint(accelerator: "Accelerator", output_dir: str | None = None, safe_serialization: bool = True) -> Path:
    """Write a complete, atomically published checkpoint of everything `accelerator` prepared; returns its path."""
    state = accelerator.state
    n, rank = state.num_processes, state.process_index
    config = accelerator.project_configuration
    target, automatic = _target_dir(accelerator, output_dir)
    publisher = state.is_local_main_process if config.save_on_each_node else state.is_main_process
    error = None
    if publisher:
        try:
            begin_staging(target)
        except (CheckpointError, OSError) as failure:
            error = str(failure)
    _agree(error, n)
    staging = staging_path(target)

    strategy = accelerator.strategy
    models = list(accelerator._models)
    sharded = strategy.writes_own_checkpoint_files
    # Every process asks the strategy (a sharded one gathers); only the main process gets full values back.
    weights = [] if sharded else [strategy.model_state_dict(model) for model in models]
    optimizer_states = [] if sharded else [strategy.optimizer_state_dict(opt) for opt in accelerator._optimizers]
    for hook in accelerator._save_state_pre_hooks.values():
        hook(models, weights, str(staging))  # a hook may pop weights it saves itself (e.g. save_pretrained)
    files: dict[str, int] = {}
    error = None
    try:
        staging.mkdir(parents=True, exist_ok=True)  # a process on another machine without a shared disk
        if sharded:  # each process writes its own shard of every model and optimizer
            files.update(strategy.save_checkpoint_files(staging, models, accelerator._optimizers))
        if publisher:
            model_base = SAFE_WEIGHTS_NAME if safe_serialization else WEIGHTS_NAME
            for i, weight in enumerate(weights):
                files.update([_write_model(staging, indexed_name(model_base, i), weight, safe_serialization)])
            for i, optimizer_state in enumerate(optimizer_states):
                files.update([_write(staging, indexed_name(f"{OPTIMIZER_NAME}.bin", i), optimizer_state)])
            for i, scheduler in enumerate(accelerator._schedulers):
                files.update([_write(staging, indexed_name(f"{SCHEDULER_NAME}.bin", i), scheduler.state_dict())])
            for i, loader in enumerate(accelerator._dataloaders):
                files.update([_write(staging, indexed_name(f"{SAMPLER_NAME}.bin", i), loader.state_dict())])
            if accelerator.scaler is not None:
                files.update([_write(staging, SCALER_NAME, accelerator.scaler.state_dict())])
            for i, obj in enumerate(accelerator._custom_objects):
                files.update([_write(staging, f"{CUSTOM_STATE_NAME}_{i}.pkl", obj.state_dict())])
        files.update([_write(staging, f"{RNG_STATE_NAME}_{rank}.pkl", capture_rng_state())])
        # Mid-accumulation, the gradients gathered so far are state too (and differ per process).
        gradients = {f"{i}.{name}": grad for i, model in enumerate(models)
                     for name, grad in strategy.model_gradients(model).items()}
        if gradients:
            files.update([_write_model(staging, f"{GRADIENTS_NAME}_{rank}.safetensors", gradients, True)])
    except Exception as failure:  # noqa: BLE001 - reported to every process, then raised everywhere
        error = f"writing the checkpoint failed: {type(failure).__name__}: {failure}"
    reports = _all_gather((error, files), n)
    first_error = next((e for e, _ in reports if e is not None), None)
    if first_error is None and publisher:
        all_files = {name: size for _, part in reports for name, size in part.items()}
        try:
            write_manifest(staging, {
                "iteration": config.iteration if automatic else None,
                "num_processes": n,
                "step": accelerator.gradient_state.step,
                "files": all_files,
                "contents": {"models": len(models) if sharded else len(weights), "optimizers": len(accelerator._optimizers),
                             "schedulers": len(accelerator._schedulers), "dataloaders": len(accelerator._dataloaders),
                             "custom": len(accelerator._custom_objects), "scaler": accelerator.scaler is not None,
                             "model_format": _model_format(strategy, safe_serialization)},
            })
            publish(staging, target)
        except OSError as failure:
            first_error = f"publishing the checkpoint failed: {failure}"
    if first_error is not None and publisher:
        shutil.rmtree(staging, ignore_errors=True)  # the previous checkpoint, if any, is untouched
    _agree(first_error, n)  # every process knows the outcome before going on
    if automatic:
        if publisher:
            rotate_checkpoints(target.parent, config.total_limit, keep=target)
        config.iteration += 1
    _barrier(n)
    return target


SHARDED_FORMAT = "sharded:"  # + the strategy's name: models and optimizers are in the strategy's own files


def _model_format(strategy: Any, safe_serialization: bool) -> str:
    """How models and optimizers are stored: full files (safetensors or torch) or a strategy's own shards."""
    if strategy.writes_own_checkpoint_files:
        return SHARDED_FORMAT + strategy.name
    return "safetensors" if safe_serialization else "torch"


# -- loading -----------------------------------------------------------------------------------
@dataclass
class CheckpointContents:
    """Everything read from a checkpoint, checked, and not yet applied."""

    path: Path
    manifest: dict[str, Any]
    models: list[tuple[Any, dict[str, torch.Tensor]]] = field(default_factory=list)
    optimizers: list[dict[str, Any]] = field(default_factory=list)
    schedulers: list[dict[str, Any]] = field(default_factory=list)
    dataloaders: list[dict[str, Any]] = field(default_factory=list)
    scaler: dict[str, Any] | None = None
    custom: list[dict[str, Any]] = field(default_factory=list)
    rng: dict[str, Any] | None = None
    gradients: dict[str, torch.Tensor] = field(default_factory=dict)
    sharded: Any = None  # what a sharded strategy read (its own files), not yet applied


def _read(path: Path, name: str) -> Any:
    try:
        return torch.load(path / name, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        first = str(error).strip().splitlines()[0]
        raise CheckpointError(
            f"{name} in {path} holds Python objects that hasten does not unpickle (it loads with weights_only=True): "
            f"{first}; make state_dict() return only tensors, numbers, strings, lists and dicts, or, if you trust this "
            "file, allow the type with torch.serialization.add_safe_globals([...])."
        ) from None
    except Exception as error:  # noqa: BLE001 - a damaged file: say which
        raise CheckpointError(f"{name} in {path} cannot be read ({type(error).__name__}: {error}); the checkpoint is damaged.") from None


def _check_count(manifest: dict[str, Any], what: str, now: int) -> None:
    saved = manifest["contents"].get(what, 0)
    if saved != now:
        raise CheckpointError(
            f"the checkpoint holds {saved} {what} but this run prepared {now}; prepare (and register) the same objects, "
            "in the same order, as the run that saved it."
        )


def _check_model(name: str, saved: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    missing = [k for k in expected if k not in saved]
    unexpected = [k for k in saved if k not in expected]
    if missing or unexpected:
        raise CheckpointError(f"{name} does not fit the model: missing keys {missing[:4]}, unexpected keys {unexpected[:4]}.")
    for key, tensor in saved.items():
        if tensor.shape != expected[key].shape:
            raise CheckpointError(
                f"{name} does not fit the model: {key} has shape {tuple(tensor.shape)} in the checkpoint "
                f"but {tuple(expected[key].shape)} in the model."
            )


def _check_optimizer(name: str, saved: dict[str, Any], optimizer: Any) -> None:
    groups = optimizer.param_groups
    saved_groups = saved.get("param_groups", [])
    if len(saved_groups) != len(groups) or any(len(a["params"]) != len(b["params"]) for a, b in zip(saved_groups, groups)):
        sizes = [len(g["params"]) for g in saved_groups], [len(g["params"]) for g in groups]
        raise CheckpointError(
            f"{name} does not fit the optimizer: parameter groups of sizes {sizes[0]} in the checkpoint, {sizes[1]} now."
        )
    params = [p for g in groups for p in g["params"]]
    ids = [i for g in saved_groups for i in g["params"]]
    by_id = dict(zip(ids, params))
    for index, entry in saved.get("state", {}).items():
        param = by_id.get(index)
        for key, value in entry.items():
            if param is not None and isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                raise CheckpointError(
                    f"{name} does not fit the optimizer: state {key!r} has shape {tuple(value.shape)} "
                    f"for a parameter of shape {tuple(param.shape)}."
                )


def resolve_load_dir(accelerator: "Accelerator", input_dir: str | None) -> Path | None:
    """The checkpoint `load_state` would load: the given one, else the newest complete automatic one (None if none yet)."""
    if input_dir is not None:
        return resolve_complete(Path(input_dir))
    config = accelerator.project_configuration
    if not config.automatic_checkpoint_naming:
        raise ValueError(
            "load_state() needs a directory: pass load_state(input_dir) or create the Accelerator with "
            "ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)."
        )
    return latest_checkpoint(checkpoints_root(config))


def read_checkpoint(accelerator: "Accelerator", path: Path, restore_position: bool) -> CheckpointContents:
    """Read and check everything this process needs from `path`; nothing in memory is changed."""
    manifest = read_manifest(path)
    contents = CheckpointContents(path=path, manifest=manifest)
    strategy = accelerator.strategy
    models = list(accelerator._models)
    for hook in accelerator._load_state_pre_hooks.values():
        hook(models, str(path))  # a hook may pop models it loads itself (e.g. from_pretrained)
    _check_count(manifest, "models", len(models))
    _check_count(manifest, "optimizers", len(accelerator._optimizers))
    _check_count(manifest, "schedulers", len(accelerator._schedulers))
    _check_count(manifest, "dataloaders", len(accelerator._dataloaders))
    _check_count(manifest, "custom", len(accelerator._custom_objects))
    model_format = manifest["contents"].get("model_format", "safetensors")
    sharded = model_format.startswith(SHARDED_FORMAT)
    if sharded and model_format != _model_format(strategy, True):
        raise CheckpointError(
            f"{path} holds models sharded by {model_format[len(SHARDED_FORMAT):]}, but this run uses {strategy.name}; "
            f"load it under the same strategy, or turn it into full weights first with `hasten merge-weights`."
        )
    safe = model_format == "safetensors"
    model_base = SAFE_WEIGHTS_NAME if safe else WEIGHTS_NAME
    names = [] if sharded else [indexed_name(model_base, i) for i in range(len(models))]
    names += [] if sharded else [indexed_name(f"{OPTIMIZER_NAME}.bin", i) for i in range(len(accelerator._optimizers))]
    names += [indexed_name(f"{SCHEDULER_NAME}.bin", i) for i in range(len(accelerator._schedulers))]
    names += [indexed_name(f"{SAMPLER_NAME}.bin", i) for i in range(len(accelerator._dataloaders))]
    names += [f"{CUSTOM_STATE_NAME}_{i}.pkl" for i in range(len(accelerator._custom_objects))]
    if accelerator.scaler is not None and manifest["contents"].get("scaler"):
        names.append(SCALER_NAME)
    check_files(path, manifest, names)

    if sharded:  # every file any process wrote must be whole before any process reads its part
        check_files(path, manifest, list(manifest["files"]))
        try:
            contents.sharded = strategy.read_checkpoint_files(path, models, accelerator._optimizers)
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
        _check_model(name, saved, strategy.model_state_dict_shapes(model))
        contents.models.append((model, saved))
    for i, optimizer in enumerate([] if sharded else accelerator._optimizers):
        name = indexed_name(f"{OPTIMIZER_NAME}.bin", i)
        saved = _read(path, name)
        _check_optimizer(name, saved, optimizer)
        contents.optimizers.append(saved)
    contents.schedulers = [_read(path, indexed_name(f"{SCHEDULER_NAME}.bin", i)) for i in range(len(accelerator._schedulers))]
    for i, loader in enumerate(accelerator._dataloaders):
        saved = _read(path, indexed_name(f"{SAMPLER_NAME}.bin", i))
        try:  # the checks load_state_dict would fail on, made now, before anything changes
            if restore_position:
                loader.batches_to_skip(saved)
            if loader.order is not None and saved.get("order") is not None:
                loader.order.check_state(saved["order"])
        except ValueError as error:
            raise CheckpointError(f"data loader {i}: {error}") from None
        contents.dataloaders.append(saved)
    if SCALER_NAME in names:
        contents.scaler = _read(path, SCALER_NAME)
    contents.custom = [_read(path, f"{CUSTOM_STATE_NAME}_{i}.pkl") for i in range(len(accelerator._custom_objects))]
    grads_name = f"{GRADIENTS_NAME}_{accelerator.process_index}.safetensors"
    if grads_name in manifest["files"]:
        check_files(path, manifest, [grads_name])
        contents.gradients = read_weights_file(path / grads_name)
        for i, model in enumerate(models):
            shapes = {f"{i}.{k}": v for k, v in strategy.model_state_dict_shapes(model).items()}
            for key, grad in contents.gradients.items():
                if key.startswith(f"{i}.") and (key not in shapes or shapes[key].shape != grad.shape):
                    raise CheckpointError(f"{grads_name} does not fit model {i}: {key} has no parameter of that shape.")
    rng_name = f"{RNG_STATE_NAME}_{accelerator.process_index}.pkl"
    if (path / rng_name).is_file():
        check_files(path, manifest, [rng_name])
        contents.rng = _read(path, rng_name)
    return contents


def apply_checkpoint(accelerator: "Accelerator", contents: CheckpointContents) -> None:
    """Put checked contents into the live objects (after every process agreed they are fine)."""
    strategy = accelerator.strategy
    if contents.sharded is not None:
        strategy.apply_checkpoint_files(contents.sharded)
    for model, saved in contents.models:
        strategy.load_model_state_dict(model, saved)
    for i, model in enumerate(accelerator._models):
        prefix = f"{i}."
        strategy.load_model_gradients(model, {k[len(prefix):]: v for k, v in contents.gradients.items() if k.startswith(prefix)})
    for optimizer, saved in zip(accelerator._optimizers, contents.optimizers):
        strategy.load_optimizer_state_dict(optimizer, saved)
    for scheduler, saved in zip(accelerator._schedulers, contents.schedulers):
        scheduler.load_state_dict(saved)
    for loader, saved in zip(accelerator._dataloaders, contents.dataloaders):
        loader.load_state_dict(saved, restore_position=accelerator.use_stateful_dataloader)
    if contents.scaler is not None:
        accelerator.scaler.load_state_dict(contents.scaler)
    for obj, saved in zip(accelerator._custom_objects, contents.custom):
        obj.load_state_dict(saved)
    if contents.rng is not None:
        restore_rng_state(contents.rng)
    accelerator.gradient_state.step = int(contents.manifest.get("step", 0))
    iteration = contents.manifest.get("iteration")
    if iteration is not None and accelerator.project_configuration.automatic_checkpoint_naming:
        accelerator.project_configuration.iteration = iteration + 1


def load_checkpoint(accelerator: "Accelerator", input_dir: str | None = None,
                    on_missing_rng: Callable[[str], None] | None = None) -> Path | None:
    """Check, agree, then restore everything; returns the checkpoint loaded (None: automatic naming, none yet)."""
    n = accelerator.num_processes
    error, contents, path = None, None, None
    try:
        path = resolve_load_dir(accelerator, input_dir)
        if path is not None:
            contents = read_checkpoint(accelerator, path, restore_position=accelerator.use_stateful_dataloader)
    except CheckpointError as failure:
        error = str(failure)
    _agree(error, n)
    found = _all_gather(None if path is None else str(path), n)
    if len(set(found)) > 1:
        raise CheckpointError(f"the processes found different checkpoints to resume from ({found}); use a shared disk "
                              "or pass the same input_dir on every process.")
    if contents is None:
        return None
    if contents.rng is None and on_missing_rng is not None:
        on_missing_rng(f"{contents.path} has no RNG state for process {accelerator.process_index} (it was saved by "
                       f"{contents.manifest.get('num_processes')} processes); this process keeps its own random state.")
    apply_checkpoint(accelerator, contents)
    _barrier(n)
    return contents.path
