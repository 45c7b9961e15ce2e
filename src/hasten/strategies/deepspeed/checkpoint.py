"""One process's shard of a DeepSpeed engine: written with `torch.save`, read with ``weights_only=True``.

A shard holds what ZeRO keeps on that process: the fp32 master partition
of every parameter group, the torch optimizer's state for it, the loss
scaler's numbers and the engine's step counters; process 0's shard also
holds the module's buffers (not partitioned). Nothing in it is a pickled
DeepSpeed object, unlike DeepSpeed's own checkpoint files. Loading goes
through the ZeRO optimizer's `load_state_dict`, so the 16-bit (or fp32)
model weights are refreshed from the restored master partition exactly as
DeepSpeed does.

Each shard also records its *layout*: which elements of which parameter
sit where in its partitions (DeepSpeed's own bookkeeping, read off the
engine). A run with another number of processes reads every saved shard,
puts each parameter's master weights and optimizer state back together
by name, and cuts them along its own engine's layout (`reshard`) — what
DeepSpeed's universal checkpoint does offline, done at load time.

A model that no optimizer trains (an engine that only runs forward, such as
a frozen teacher under ZeRO-3, or a model left unwrapped) has no master
partition: its full weights are saved instead, gathered one parameter at a
time (`gather_weights`), and load on any number of processes.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

__all__ = ["save_shard", "read_shard", "check_shard", "reshard", "apply_shard", "gather_weights", "save_weights",
           "read_weights", "apply_weights"]

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


# A fragment: (parameter name, start in the partition, element count, start in the flattened parameter).
Fragment = tuple[str, int, int, int]


def _layout(engine: Any, stage: int) -> dict[str, Any]:
    """Where every parameter's elements sit in this process's fp32 partitions, from DeepSpeed's own bookkeeping."""
    optimizer = engine.optimizer
    names = {id(p): name for name, p in engine.module.named_parameters()}
    partitions: list[list[Fragment]] = []
    numel: dict[str, int] = {}
    if stage in (1, 2):  # one flat buffer per group; each parameter maps to at most one piece of this partition
        for group in optimizer.bit16_groups:
            fragments = []
            for param in group:
                numel[names[id(param)]] = param.numel()
                mapping = getattr(param, "_hp_mapping", None)
                if mapping is not None:
                    hp, lp = mapping.hp_fragment_address, mapping.lp_fragment_address
                    fragments.append((names[id(param)], int(hp.start), int(hp.numel), int(lp.start)))
            partitions.append(fragments)
    elif stage == 3:  # every parameter cut in equal pieces; this process's piece at its place in the sub-group
        for group in optimizer.fp16_groups:
            fragments = []
            for param in group:
                name, whole = names[id(param)], int(param.ds_numel)
                numel[name] = whole
                _, offset, size = optimizer.grad_position[optimizer.get_param_id(param)]
                first = optimizer._get_param_partition_rank(param) * size
                if first < whole:
                    fragments.append((name, int(offset), min(size, whole - first), first))
            partitions.append(fragments)
    return {"partitions": partitions, "numel": numel}


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
        "layout": _layout(engine, stage),
    }
    torch.save(payload, path)


def read_shard(path: Path, engine: Any, world_size: int | None = None, check_partitions: bool = True) -> dict[str, Any]:
    """Read and check one shard into new memory (of `world_size` processes, when given); raises `ValueError`
    naming what does not fit."""
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
    if world_size is not None and shard["world_size"] != world_size:
        raise ValueError(f"{path.name} was saved by {shard['world_size']} processes but this run has {world_size}; "
                         "resume with the same number of processes.")
    if check_partitions:
        check_shard(path.name, shard, engine)
    return shard


def check_shard(name: str, shard: dict[str, Any], engine: Any) -> None:
    """Check that a shard (read, or rebuilt by `reshard`) fits this process's partitions of `engine`."""
    stage = _stage(engine)
    path = Path(name)
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


def _whole(shards: list[dict[str, Any]], numel: dict[str, int], flat_of: Any) -> dict[str, torch.Tensor]:
    """Each parameter's flattened tensor put together from every shard's fragments (`flat_of(shard, k)`: partition k)."""
    whole: dict[str, torch.Tensor] = {}
    filled = dict.fromkeys(numel, 0)
    for shard in shards:
        for k, fragments in enumerate(shard["layout"]["partitions"]):
            flat = flat_of(shard, k)
            for name, start, count, first in fragments:
                if name not in whole:
                    whole[name] = torch.zeros(numel[name], dtype=flat.dtype)
                whole[name][first:first + count] = flat[start:start + count]
                filled[name] += count
    missing = [name for name, n in numel.items() if filled[name] != n]
    if missing:
        raise ValueError(f"the saved shards do not hold all of {missing[:3]}; the checkpoint is incomplete.")
    return whole


def _cut(whole: dict[str, torch.Tensor], fragments: list[Fragment], like: torch.Tensor) -> torch.Tensor:
    flat = torch.zeros(like.numel(), dtype=like.dtype)  # padding stays zero, as DeepSpeed's
    for name, start, count, first in fragments:
        flat[start:start + count] = whole[name][first:first + count]
    return flat


def reshard(shards: list[dict[str, Any]], engine: Any) -> dict[str, Any]:
    """This process's shard for `engine`'s partitioning, built from the shards every saving process wrote.

    Master weights and the optimizer's per-element state (Adam's moments)
    are put together per parameter by name and cut along this engine's
    layout; per-partition numbers (Adam's step), hyperparameters, counters and
    the loss scale are the saving process 0's. Raises `ValueError` naming what does not fit.
    """
    first = shards[0]
    stage = _stage(engine)
    if stage == 0:  # nothing partitioned: process 0's shard holds the whole model and optimizer
        return first
    if any(shard.get("layout") is None for shard in shards):
        raise ValueError(f"the checkpoint was saved by {first['world_size']} processes without the parameter layout "
                         "that re-partitioning needs (an older hasten); resume it on that many processes.")
    layout, numel = _layout(engine, stage), first["layout"]["numel"]
    if numel != layout["numel"]:
        differ = sorted(set(numel).symmetric_difference(layout["numel"])) or \
            sorted(n for n in numel if numel[n] != layout["numel"][n])
        raise ValueError(f"the checkpoint does not fit the model: parameters {differ[:3]} differ in name or size.")
    live = _fp32_partitions(engine.optimizer, stage)
    if len(live) != len(first["fp32"]):
        raise ValueError(f"the checkpoint holds {len(first['fp32'])} parameter partitions but this engine has "
                         f"{len(live)}; use the same parameter groups (and sub_group_size).")
    fp32 = _whole(shards, numel, lambda shard, k: shard["fp32"][k])
    saved_state: dict[int, dict[str, Any]] = first["base_optimizer"].get("state", {})
    per_element = {key for k, values in saved_state.items() for key, value in values.items()
                   if isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() == first["fp32"][k].numel()}
    wholes = {key: _whole(shards, numel, lambda shard, k, key=key: shard["base_optimizer"]["state"][k][key])
              for key in sorted(per_element)}
    state = {k: {key: _cut(wholes[key], layout["partitions"][k], live[k]) if key in wholes else value
                 for key, value in values.items()}
             for k, values in saved_state.items()}
    return {**first, "fp32": [_cut(fp32, fragments, live[k]) for k, fragments in enumerate(layout["partitions"])],
            "base_optimizer": {**first["base_optimizer"], "state": state}, "layout": layout}


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
            if optimizer.optimizer.state and hasattr(optimizer, "_lazy_init_hp_params_optimizer_state"):
                # DeepSpeed links each parameter to views of the optimizer state at its first step; the loaded state
                # is new tensors, so link again (else safe_get_full_optimizer_state reads stale or no state).
                optimizer._hp_optimizer_states_linked = False
                optimizer._lazy_init_hp_params_optimizer_state()
    for name, value in shard["counters"].items():
        if hasattr(engine, name):
            setattr(engine, name, value)
    if extras:
        buffers = dict(engine.module.named_buffers())
        for name, value in extras.items():
            if name in buffers:
                buffers[name].copy_(value)


# -- models no optimizer trains: full weights -------------------------------------------------------------------------
def _parameters(module: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return dict(module.named_parameters(remove_duplicate=False))  # tied weights under each of their names


def _gathered(param: torch.Tensor, modifier_rank: int | None = None) -> Any:
    """ZeRO-3's gather of one partitioned parameter (whole on every process inside), else nothing to do."""
    import contextlib

    if not hasattr(param, "ds_id"):
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters([param], modifier_rank=modifier_rank)


def gather_weights(module: torch.nn.Module, keep: bool) -> dict[str, torch.Tensor]:
    """`module`'s full state dict on the CPU where `keep`, gathered one parameter at a time under ZeRO-3 (so at
    most one whole parameter is added to each process's memory); every process must call it, in the same order."""
    params = _parameters(module)
    weights: dict[str, torch.Tensor] = {}
    for name, value in module.state_dict(keep_vars=True).items():
        with _gathered(params.get(name, value)):
            if keep:
                weights[name] = params.get(name, value).detach().to("cpu", copy=True)
    return weights


def save_weights(weights: dict[str, torch.Tensor], path: Path) -> None:
    """Write what `gather_weights` returned (the caller fsyncs)."""
    torch.save({"format": FORMAT_VERSION, "weights": weights}, path)


def _full_shape(tensor: torch.Tensor) -> tuple[int, ...]:
    return tuple(getattr(tensor, "ds_shape", tensor.shape))


def read_weights(path: Path, module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Read and check a model's full weights for `module` (memory-mapped); raises `ValueError` naming what does not fit."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as error:
        raise ValueError(f"{path.name} holds Python objects that hasten does not unpickle ({error}); "
                         "it was not written by hasten's DeepSpeed strategy.") from None
    except FileNotFoundError:
        raise ValueError(f"{path.name} is missing: the checkpoint saved this model with its optimizer (or not at all); "
                         "prepare the models in the order and way the saving run did.") from None
    if not isinstance(saved, dict) or saved.get("format") != FORMAT_VERSION:
        raise ValueError(f"{path.name} is not a hasten DeepSpeed weights file of format {FORMAT_VERSION}.")
    weights = saved["weights"]
    live = module.state_dict(keep_vars=True)
    if set(weights) != set(live):
        differ = sorted(set(weights).symmetric_difference(live))
        raise ValueError(f"{path.name} does not fit the model: the names {differ[:3]} are in only one of them.")
    shapes = {name: _full_shape(_parameters(module).get(name, value)) for name, value in live.items()}
    wrong = [name for name, value in weights.items() if tuple(value.shape) != shapes[name]]
    if wrong:
        raise ValueError(f"{path.name} does not fit the model: {wrong[0]} was saved with shape "
                         f"{tuple(weights[wrong[0]].shape)}, the model has {shapes[wrong[0]]}.")
    return weights


def apply_weights(module: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Copy checked full weights into `module`, one parameter at a time under ZeRO-3 (every process calls it)."""
    params = _parameters(module)
    with torch.no_grad():
        for name, value in module.state_dict(keep_vars=True).items():
            target = params.get(name, value)
            with _gathered(target, modifier_rank=0):  # process 0's copy is partitioned again on leaving
                target.copy_(weights[name])
