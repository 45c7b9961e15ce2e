"""State of FSDP2 models and optimizers: full state dicts, sharded files (torch.distributed.checkpoint), gradients.

Every function here is collective: every process calls it with its own shard.
Sharded files keep the peer's layout inside a checkpoint: one DCP directory
per model (``pytorch_model_fsdp_<i>``) and per optimizer (``optimizer_<i>``),
each process writing its own ``__<rank>_0.distcp`` and the main process the
``.metadata``. `hasten merge-weights` turns a model directory into safetensors.

`save_state` / `load_state` save and load FSDP models and optimizers with
these; the peer's `save_fsdp_model` and friends, for scripts that call them
directly, are in `checkpoint_functions.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from concurrent.futures import Future
from typing import Any, Callable, cast

import torch
from torch import nn

__all__ = [
    "MODEL_DIR", "OPTIMIZER_DIR", "full_model_state_dict", "load_full_model_state_dict", "full_optimizer_state_dict",
    "load_full_optimizer_state_dict", "full_gradients", "load_full_gradients", "save_sharded", "read_sharded",
    "apply_sharded", "begin_sharded", "merge_fsdp_weights",
]

MODEL_DIR = "pytorch_model_fsdp"
OPTIMIZER_DIR = "optimizer"
# Inside a DCP directory the state sits under one key, as Accelerate writes it ({"model": ...} / {"optimizer": ...}),
# so that either library loads the other's sharded checkpoints.
MODEL_KEY = "model"
OPTIMIZER_KEY = "optimizer"


def _options(**kwargs: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kwargs)


# -- full state dicts -------------------------------------------------------------------------------
def full_model_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Gathered on the main process, in CPU memory; the other processes get an empty dict."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return cast(dict[str, torch.Tensor], get_model_state_dict(model, options=_options(full_state_dict=True, cpu_offload=True)))


def load_full_model_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(model, cast(dict[str, Any], state_dict), options=_options(full_state_dict=True))


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, **options: Any) -> dict[str, Any]:
    """torch's optimizer state dict, leaving an optimizer that never stepped as it was.

    (torch creates missing state with a zero-gradient, zero-lr step; kept, it
    would shift Adam's step count by one and change the next real step.)
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    fresh = not optimizer.state
    try:
        return get_optimizer_state_dict(model, optimizer, options=_options(**options))
    finally:
        if fresh:
            optimizer.state.clear()


def full_optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Keyed by parameter names; gathered on the main process (empty elsewhere)."""
    return optimizer_state(model, optimizer, full_state_dict=True, cpu_offload=True)


def load_full_optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state_dict, options=_options(full_state_dict=True))


# -- gradients between two optimizer steps ------------------------------------------------------------
def _pending_unsharded(model: nn.Module) -> bool:
    """Gradients accumulated without reduce-scatter (inside no_sync) live in FSDP's own buffers, not in .grad."""
    for module in model.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        group = get_state()._fsdp_param_group if get_state is not None else None
        for fsdp_param in getattr(group, "fsdp_params", None) or []:
            unsharded = getattr(fsdp_param, "_unsharded_param", None)
            if fsdp_param.unsharded_accumulated_grad is not None or (unsharded is not None and unsharded.grad is not None):
                return True
    return False


def full_gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    """The (already reduced) gradients as full tensors; refuses while unreduced gradients are pending."""
    if _pending_unsharded(model):
        raise RuntimeError(
            "under FSDP the gradients accumulated since the last optimizer step are not reduced yet and cannot be "
            "saved; save when accelerator.sync_gradients is True, or use GradientAccumulationPlugin(sync_each_batch=True)."
        )
    grads = {}
    for name, param in model.named_parameters():
        if param.grad is not None:
            grad = param.grad
            grads[name] = (grad.full_tensor() if hasattr(grad, "full_tensor") else grad).detach().cpu()
    return grads


def load_full_gradients(model: nn.Module, gradients: dict[str, torch.Tensor]) -> None:
    from torch.distributed.tensor import DTensor, distribute_tensor

    for name, param in model.named_parameters():
        saved = gradients.get(name)
        if saved is None:
            param.grad = None
        elif isinstance(param, DTensor):  # each process keeps its own slice; no communication
            local = saved.to(device=param.device, dtype=param.dtype)
            param.grad = distribute_tensor(local, param.device_mesh, param.placements, src_data_rank=None)
        else:
            param.grad = saved.to(device=param.device, dtype=param.dtype)


# -- sharded files --------------------------------------------------------------------------------------
def _files_under(root: Path, directory: Path) -> dict[str, int]:
    """The files this process wrote into a DCP `directory`: its own shards (``__<rank>_*.distcp``, named by DCP's
    file-system writer) and, on the coordinating process, ``.metadata``. On a disk every process shares, the others'
    shards are theirs to list (and hash): listing the whole folder made each process hash every shard."""
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    return files_written_by(root, directory, rank)


def files_written_by(root: Path, directory: Path, rank: int) -> dict[str, int]:
    """{path under `root`: size} of the files DCP's writer of process `rank` puts into `directory`.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp()); (root / "m").mkdir()
        >>> for name in ("__0_0.distcp", "__1_0.distcp", ".metadata"): _ = (root / "m" / name).write_bytes(b"x")
        >>> sorted(files_written_by(root, root / "m", 1)), sorted(files_written_by(root, root / "m", 0))
        (['m/__1_0.distcp'], ['m/.metadata', 'm/__0_0.distcp'])
    """
    mine = f"__{rank}_"
    return {str(f.relative_to(root)): f.stat().st_size for f in sorted(directory.rglob("*"))
            if f.is_file() and (f.name.startswith(mine) or (rank == 0 and not f.name.startswith("__")))}


def save_sharded(root: Path, models: list[nn.Module], pairs: list[tuple[nn.Module, Any]]) -> dict[str, int]:
    """Each process writes its shard of every model and optimizer under `root`; returns the files it sees there."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    written: dict[str, int] = {}
    for i, model in enumerate(models):
        target = root / f"{MODEL_DIR}_{i}"
        dcp.save({MODEL_KEY: get_model_state_dict(model)}, checkpoint_id=target)
        written.update(_files_under(root, target))
    for i, (model, optimizer) in enumerate(pairs):
        target = root / f"{OPTIMIZER_DIR}_{i}"
        dcp.save({OPTIMIZER_KEY: optimizer_state(model, optimizer)}, checkpoint_id=target)
        written.update(_files_under(root, target))
    return written


_async_groups: tuple[Any, list[Any]] = (None, [])  # (the default group they belong to, one gloo group per directory)


def _background_group(index: int) -> Any:
    """The `index`-th gloo group for background saves (collective: created on every process at the same save).

    DCP's background save runs its collectives on a thread beside training,
    so it must not share a group with the training thread's collectives, nor
    with another directory's background save running at the same time.
    """
    import torch.distributed as dist

    global _async_groups
    default = dist.distributed_c10d._get_default_group()
    owner, groups = _async_groups
    if owner is not default:  # a new process group (or the first save): the old groups went with the old one
        _async_groups = owner, groups = default, []
    while len(groups) <= index:
        groups.append(dist.new_group(backend="gloo"))
    return groups[index]


def begin_sharded(root: Path, models: list[nn.Module], pairs: list[tuple[nn.Module, Any]]) -> Callable[[], dict[str, int]]:
    """Copy this process's shards off the live tensors now (DCP's async_save stages them in CPU memory) and write them
    in the background; the returned call waits for the writes and returns the files, as `save_sharded` does.

    Same directories and files as `save_sharded` (DCP's `.metadata` holds a
    fresh save id each time, so it differs between any two saves; the
    `.distcp` shards are the same bytes).
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    states = [(root / f"{MODEL_DIR}_{i}", {MODEL_KEY: get_model_state_dict(model)}) for i, model in enumerate(models)]
    states += [(root / f"{OPTIMIZER_DIR}_{i}", {OPTIMIZER_KEY: optimizer_state(model, optimizer)})
               for i, (model, optimizer) in enumerate(pairs)]
    distributed = dist.is_initialized()
    futures = [(target, dcp.async_save(state, checkpoint_id=target, no_dist=not distributed,
                                       process_group=_background_group(i) if distributed else None))
               for i, (target, state) in enumerate(states)]

    def finish() -> dict[str, int]:
        written: dict[str, int] = {}
        for target, future in futures:
            cast(Future, future).result()
            written.update(_files_under(root, target))
        return written

    return finish


def _fresh_like(value: Any) -> Any:
    """New memory shaped like `value` (DTensors keep their mesh and placements), for reading without touching live state."""
    if isinstance(value, torch.Tensor):
        return torch.empty_like(value)
    if isinstance(value, dict):
        return {k: _fresh_like(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_fresh_like(v) for v in value]
    return value


@dataclass
class ShardedContents:
    models: list[tuple[nn.Module, dict[str, Any]]] = field(default_factory=list)
    optimizers: list[tuple[nn.Module, Any, dict[str, Any]]] = field(default_factory=list)


def _saved_under(directory: Path, key: str, target: dict[str, Any]) -> bool:
    """Whether the DCP checkpoint in `directory` holds its state under `key` (Accelerate's and hasten's layout)
    rather than at the top (hasten's layout before 1.15), judged from the saved names, not guessed from the version.

    A model whose every name starts with ``model.`` saved the old way looks
    wrapped by its names alone; its own names found as saved names say it is not.
    """
    from torch.distributed.checkpoint import FileSystemReader

    saved = FileSystemReader(str(directory)).read_metadata().state_dict_metadata
    prefix = f"{key}."
    return all(name.startswith(prefix) for name in saved) and not any(name in saved for name in target)


def _dcp_load(target: dict[str, Any], directory: Path, key: str) -> dict[str, Any]:
    """DCP's load, resharding into `target`'s layout (any number of processes, or whole tensors in one process);
    returns the loaded state (`target`, whose tensors are read in place, with its other values replaced)."""
    import warnings

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    holder = {key: target} if _saved_under(directory, key, target) else target
    with warnings.catch_warnings():  # one process without a group: "assuming the intent is to load in a single process"
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load(holder, checkpoint_id=directory, no_dist=not dist.is_initialized())
    return cast(dict[str, Any], holder[key]) if holder is not target else target


def read_sharded(root: Path, models: list[nn.Module], pairs: list[tuple[nn.Module, Any]]) -> ShardedContents:
    """Read this process's part of the shards into new memory; the live models and optimizers are not changed.

    The saved number of processes need not be this run's: DCP reads each
    tensor's saved pieces into this run's sharding (or whole tensors).
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    contents = ShardedContents()
    for i, model in enumerate(models):
        target = _dcp_load(_fresh_like(get_model_state_dict(model)), root / f"{MODEL_DIR}_{i}", MODEL_KEY)
        contents.models.append((model, target))
    for i, (model, optimizer) in enumerate(pairs):
        target = _dcp_load(_fresh_like(optimizer_state(model, optimizer)), root / f"{OPTIMIZER_DIR}_{i}", OPTIMIZER_KEY)
        contents.optimizers.append((model, optimizer, target))
    return contents


def apply_sharded(contents: ShardedContents) -> None:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    for model, state in contents.models:
        set_model_state_dict(model, state)
    for model, optimizer, state in contents.optimizers:
        set_optimizer_state_dict(model, optimizer, state)


# -- merging shards into one weights file (no process group needed) ----------------------------------------
def merge_fsdp_weights(checkpoint_dir: str | Path, output_path: str | Path, safe_serialization: bool = True,
                       remove_checkpoint_dir: bool = False) -> Path:
    """Merge a sharded FSDP model (a DCP directory) into one ``model.safetensors`` (or ``pytorch_model.bin``).

    `checkpoint_dir` is either the model's DCP directory (``.../pytorch_model_fsdp_0``)
    or a checkpoint saved by `save_state`, whose first model is taken. Runs in
    one process, without a process group. Returns the written file.

    Example:
        >>> from hasten import PartialState  # in a run: accelerator.state.fsdp_plugin, accelerator
        >>> from hasten.utils import FullyShardedDataParallelPlugin, save_fsdp_model
        >>> plugin, processes = FullyShardedDataParallelPlugin(state_dict_type="SHARDED_STATE_DICT"), PartialState(cpu=True)
        >>> save_fsdp_model(plugin, processes, nn.Linear(4, 2), "ckpt/checkpoint_3")
        >>> merge_fsdp_weights("ckpt/checkpoint_3", "merged")
        PosixPath('merged/model.safetensors')
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    from ...checkpointing.constants import SAFE_WEIGHTS_NAME, WEIGHTS_NAME
    from ...checkpointing.model_files import write_weights

    source = Path(checkpoint_dir)
    if not (source / ".metadata").is_file() and (source / f"{MODEL_DIR}_0" / ".metadata").is_file():
        source = source / f"{MODEL_DIR}_0"
    if not (source / ".metadata").is_file():
        raise FileNotFoundError(f"{checkpoint_dir} holds no sharded model (no .metadata there or in {MODEL_DIR}_0/); "
                                "pass a checkpoint saved with state_dict_type SHARDED_STATE_DICT, or its model directory.")
    state: dict[str, Any] = {}
    _load_state_dict(state, storage_reader=FileSystemReader(source), planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    if set(state) == {MODEL_KEY} and isinstance(state[MODEL_KEY], dict):  # saved under "model" (Accelerate's layout)
        state = state[MODEL_KEY]
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    target_dir = Path(output_path)
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / (SAFE_WEIGHTS_NAME if safe_serialization else WEIGHTS_NAME)
    write_weights(tensors, target, safe_serialization)
    if remove_checkpoint_dir:
        import shutil

        shutil.rmtree(checkpoint_dir)
    return target
