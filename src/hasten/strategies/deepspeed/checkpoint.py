"""One process's shard of a DeepSpeed engine: written with `torch.save`, read with ``weights_only=True``.

A shard holds what ZeRO keeps on that process: the fp32 master partition
of every parameter group, the torch optimizer's state for it, the loss
scaler's numbers and the engine's step counters; process 0's shard also
holds the module's buffers (not partitioned). Nothing in it is a pickled
DeepSpeed object, unlike DeepSpeed's own checkpoint files. Loading goes
through the ZeRO optimizer's `load_state_dict`, so the 16-bit (or fp32)
model weights are refreshed from the restored master partition exactly as
DeepSpeed does.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

__all__ = ["save_shard", "read_shard", "apply_shard"]

FORMAT_VERSION = 1
_COUNTERS = ("global_steps", "global_samples", "micro_steps", "skipped_steps")


def _stage(engine: Any) -> int:
    return int(engine.zero_optimization_stage())


def _world_and_rank() -> tuple[int, int]:
    import torch.distributed as dist

    return (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)


def _fp32_partitions(optimizer: Any, stage: int) -> list[torch.Tensor]:
    if stage == 3:
        return list(optimizer.fp32_partitioned_groups_flat)
    if stage in (1, 2):
        return list(optimizer.single_partition_of_fp32_groups)
    return []


def _base_optimizer_state(optimizer: Any, stage: int) -> dict[str, Any]:
    if stage == 3:  # ZeRO-3 points the torch optimizer at its fp32 partitions only around a step
        optimizer._set_fp32_optimizer_param_groups()
        try:
            return optimizer.optimizer.state_dict()
        finally:
            optimizer._clear_fp32_optimizer_param_groups()
    if stage in (1, 2):
        return optimizer.optimizer.state_dict()
    return optimizer.state_dict()


def _loss_scaler_numbers(optimizer: Any) -> dict[str, Any]:
    scaler = getattr(optimizer, "loss_scaler", None)
    if scaler is None:
        return {}
    return {k: v for k, v in vars(scaler).items() if isinstance(v, (bool, int, float))}


def save_shard(engine: Any, path: Path, write_extras: bool) -> None:
    """Write this process's shard of `engine` to `path` (the caller fsyncs it)."""
    stage = _stage(engine)
    optimizer = engine.optimizer
    world, rank = _world_and_rank()
    if stage == 0 and not isinstance(optimizer, torch.optim.Optimizer):
        raise NotImplementedError("save_state under ZeRO stage 0 with fp16/bf16 is not supported; use ZeRO stage 1-3.")
    payload: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "zero_stage": stage,
        "world_size": world,
        "rank": rank,
        "fp32": [t.detach().clone() for t in _fp32_partitions(optimizer, stage)],
        "base_optimizer": _base_optimizer_state(optimizer, stage),
        "loss_scaler": _loss_scaler_numbers(optimizer),
        "counters": {name: int(getattr(engine, name, 0) or 0) for name in _COUNTERS},
        "module": {k: v.detach().clone() for k, v in engine.module.state_dict().items()} if stage == 0 else None,
        "extras": {k: v.detach().clone() for k, v in engine.module.named_buffers()} if write_extras else None,
    }
    torch.save(payload, path)


def read_shard(path: Path, engine: Any, world_size: int, rank: int, check_partitions: bool = True) -> dict[str, Any]:
    """Read and check one shard into new memory; raises `ValueError` naming what does not fit."""
    try:
        shard = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise ValueError(f"{path.name} holds Python objects that hasten does not unpickle ({error}); "
                         "it was not written by hasten's DeepSpeed strategy.") from None
    if not isinstance(shard, dict) or shard.get("format") != FORMAT_VERSION:
        raise ValueError(f"{path.name} is not a hasten DeepSpeed shard of format {FORMAT_VERSION}.")
    stage = _stage(engine)
    if shard["zero_stage"] != stage:
        raise ValueError(f"{path.name} was saved under ZeRO stage {shard['zero_stage']} but this run uses stage {stage}; "
                         "load it with the same zero_stage.")
    if shard["world_size"] != world_size:
        raise ValueError(f"{path.name} was saved by {shard['world_size']} processes but this run has {world_size}; "
                         "resume with the same number of processes.")
    if not check_partitions:
        return shard
    live = _fp32_partitions(engine.optimizer, stage)
    saved = shard["fp32"]
    if len(saved) != len(live) or any(a.shape != b.shape for a, b in zip(saved, live)):
        raise ValueError(f"{path.name} does not fit the model: master partitions of shapes "
                         f"{[tuple(t.shape) for t in saved]} saved, {[tuple(t.shape) for t in live]} now.")
    groups = shard["base_optimizer"].get("param_groups", [])
    live_groups = engine.optimizer.optimizer.param_groups if stage else engine.optimizer.param_groups
    if len(groups) != len(live_groups):
        raise ValueError(f"{path.name} does not fit the optimizer: {len(groups)} parameter groups saved, {len(live_groups)} now.")
    if stage == 0:
        module_keys = set(engine.module.state_dict())
        if set(shard["module"] or {}) != module_keys:
            raise ValueError(f"{path.name} does not fit the model: its parameter names differ from the model's.")
    return shard


def apply_shard(engine: Any, shard: dict[str, Any], extras: dict[str, torch.Tensor] | None) -> None:
    """Put a checked shard into the live engine (every process calls it: ZeRO-1/2 all-gather the new weights)."""
    stage = _stage(engine)
    optimizer = engine.optimizer
    world, rank = _world_and_rank()
    if stage == 0:
        engine.module.load_state_dict(shard["module"])
        optimizer.load_state_dict(shard["base_optimizer"])
    else:
        live = optimizer.state_dict()  # DeepSpeed's own metadata for this run, with the saved tensors put in
        if stage == 3:
            live["optimizer_state_dict"], live["fp32_flat_groups"] = shard["base_optimizer"], shard["fp32"]
        else:
            live["base_optimizer_state"], live["single_partition_of_fp32_groups"] = shard["base_optimizer"], shard["fp32"]
        scaler = live.get("loss_scaler")
        for name, value in shard["loss_scaler"].items():
            if scaler is not None and hasattr(scaler, name):
                setattr(scaler, name, value)
        states = [live if r == rank else None for r in range(world)]
        optimizer.load_state_dict(states, load_optimizer_states=True, load_from_fp32_weights=True)
        if stage in (1, 2):
            optimizer.update_lp_params()  # the model's weights from the restored master partitions
    for name, value in shard["counters"].items():
        if hasattr(engine, name):
            setattr(engine, name, value)
    if extras:
        buffers = dict(engine.module.named_buffers())
        for name, value in extras.items():
            if name in buffers:
                buffers[name].copy_(value)
