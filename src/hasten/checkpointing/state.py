"""What a checkpoint holds, and what saving and loading share: names, formats, agreement, reading pickles.

A checkpoint holds every prepared model (through the strategy, so sharded
engines can supply their own state), optimizer, scheduler, the fp16
GradScaler, each prepared DataLoader's position (in the manifest), each
object given to `register_for_checkpointing`, every saving process's RNG
states, and the accumulation step — in Accelerate's file names, plus
hasten's manifest. Saving is in `save.py`, loading in `load.py`, reading a
folder written by Accelerate itself in `foreign.py`.

Pickled files are read with ``weights_only=True`` (NumPy arrays allowed, as
RNG states hold them): nothing else is unpickled unless the caller passes
``load_state(..., load_kwargs={"weights_only": False})`` for a checkpoint it trusts.
"""

from __future__ import annotations

import codecs
import pickle
from pathlib import Path
from typing import Any

import torch

from ..process import watchdog
from ..core.errors import CheckpointCorrupted
from .commit import CheckpointError

__all__ = ["indexed_name", "SHARDED_FORMAT", "model_format", "all_gather", "barrier", "agree", "read_pickle",
           "needs_every_process", "TRUST_HINT"]

SHARDED_FORMAT = "sharded:"  # + the strategy's name: models and optimizers are in the strategy's own files
TRUST_HINT = "load_state(..., load_kwargs={'weights_only': False})"


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


def model_format(strategy: Any, safe_serialization: bool) -> str:
    """How models and optimizers are stored: full files (safetensors or torch) or a strategy's own shards."""
    if strategy.writes_own_checkpoint_files:
        return SHARDED_FORMAT + strategy.name
    return "safetensors" if safe_serialization else "torch"


def needs_every_process(strategy: Any) -> bool:
    """Whether saving needs every process (state gathered or written in shards) rather than the main one alone."""
    return bool(getattr(strategy, "state_needs_every_process", False) or strategy.writes_own_checkpoint_files)


# -- collectives that tolerate one process (marked, so the watchdog sees where a process waits) -------
def all_gather(value: Any, num_processes: int, operation: str) -> list[Any]:
    if num_processes == 1:
        return [value]
    import torch.distributed as dist

    gathered: list[Any] = [None] * num_processes
    with watchdog.waiting(operation, counted=False):
        dist.all_gather_object(gathered, value)
    return gathered


def barrier(num_processes: int, operation: str) -> None:
    if num_processes > 1:
        import torch.distributed as dist

        with watchdog.waiting(operation, counted=False):
            dist.barrier()


def _anyone_failed(failed: bool, operation: str) -> bool:
    """Whether any process failed: one all-reduce of one number (the messages are gathered only then)."""
    import torch
    import torch.distributed as dist

    try:  # where the default group's small collectives live (NCCL: the GPU); torch's own choice for objects
        device = dist.distributed_c10d._get_object_coll_device()
    except (AttributeError, RuntimeError):
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([int(failed)], dtype=torch.int32, device=device)
    with watchdog.waiting(operation, counted=False):
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def agree(error: str | CheckpointError | None, num_processes: int, operation: str) -> None:
    """Raise the first process's error on every process (so no process goes on alone).

    A `CheckpointError` is raised as it is, same kind and sentence everywhere (it names the process itself); a
    string becomes a `CheckpointError` prefixed with the process that gave it. When every process succeeded (the
    usual case) this costs one all-reduce of one number, not a gather of pickled objects (a third of the time an
    asynchronous save holds the training thread, before).
    """
    if num_processes > 1 and not _anyone_failed(error is not None, operation):
        return
    errors = all_gather(error, num_processes, operation)
    for rank, message in enumerate(errors):
        if isinstance(message, CheckpointError):
            raise message.with_traceback(None)
        if message is not None:
            prefix = "" if num_processes == 1 else f"on process {rank}: "
            raise CheckpointError(prefix + message)


# -- reading pickles ------------------------------------------------------------------------------------
def _numpy_globals() -> list[Any]:
    """What a pickled NumPy array (e.g. NumPy's RNG state) needs: its array type, dtypes, and bytes' codec."""
    import numpy as np

    core = getattr(np, "_core", None) or np.core
    allowed: list[Any] = [core.multiarray._reconstruct, np.ndarray, np.dtype, codecs.encode]
    allowed += [getattr(np.dtypes, name) for name in dir(getattr(np, "dtypes", None)) if name.endswith("DType")]
    return allowed


def read_pickle(path: Path, name: str, trust: bool = False, **load_kwargs: Any) -> Any:
    """One torch/pickle file of a checkpoint: ``weights_only=True`` (NumPy arrays allowed) unless `trust`."""
    try:
        if trust:
            return torch.load(path / name, map_location="cpu", weights_only=False, **load_kwargs)
        with torch.serialization.safe_globals(_numpy_globals()):
            return torch.load(path / name, map_location="cpu", weights_only=True, **load_kwargs)
    except pickle.UnpicklingError as error:
        first = str(error).strip().splitlines()[0]
        raise CheckpointError(
            f"{name} in {path} holds Python objects that hasten does not unpickle (it loads with weights_only=True): "
            f"{first}; make state_dict() return only tensors, numbers, strings, lists and dicts, or, if you trust "
            f"this checkpoint, pass {TRUST_HINT}."
        ) from None
    except FileNotFoundError:
        raise CheckpointCorrupted(f"{path} is damaged or incomplete: {name} is missing.") from None
    except Exception as error:  # noqa: BLE001 - a damaged file: say which
        raise CheckpointCorrupted(f"{name} in {path} cannot be read ({type(error).__name__}: {error}); the checkpoint is damaged.") from None
