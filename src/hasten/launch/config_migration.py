"""Older config files (hasten's earlier layouts, Accelerate's `accelerate config` files) in today's key layout."""

from __future__ import annotations

from typing import Any, Mapping

from ..process.elastic import parse_machines

__all__ = ["migrate", "FSDP_SHARDING_BY_NUMBER"]

FSDP_SHARDING_BY_NUMBER = {1: "FULL_SHARD", 2: "SHARD_GRAD_OP", 3: "NO_SHARD", 4: "HYBRID_SHARD", 5: "HYBRID_SHARD_ZERO2"}
_RENAMED_FSDP_KEYS = {"fsdp_backward_prefetch_policy": "fsdp_backward_prefetch"}


def migrate(data: Mapping[str, Any]) -> dict[str, Any]:
    """Bring an older file (hasten's or the peer tool's) to the current key layout.

    Example:
        >>> migrate({"fp16": True, "distributed_type": "DEEPSPEED"})["mixed_precision"]
        'fp16'
        >>> migrate({"num_machines": "1:3"})  # hasten's elastic range
        {'num_machines': 3, 'min_machines': 1}
    """
    data = dict(data)
    if "fp16" in data:  # very old files: a boolean instead of mixed_precision
        if data.pop("fp16"):
            data.setdefault("mixed_precision", "fp16")
    if "dynamo_backend" in data:
        backend = data.pop("dynamo_backend")
        if backend and str(backend).lower() != "no":
            data.setdefault("dynamo_config", {})["dynamo_backend"] = backend
    data.pop("use_mps_device", None)
    if data.get("distributed_type") == "DEEPSPEED":
        data.setdefault("use_deepspeed", True)
    if data.get("distributed_type") == "FSDP":
        data.setdefault("use_fsdp", True)
    mpirun = data.get("mpirun_config") or {}
    if mpirun.get("mpirun_hostfile"):
        data.setdefault("mpirun", True)
        data.setdefault("mpirun_hostfile", mpirun["mpirun_hostfile"])
    fsdp = dict(data.get("fsdp_config") or {})
    for old, new in _RENAMED_FSDP_KEYS.items():
        if old in fsdp:
            fsdp.setdefault(new, fsdp.pop(old))
    if isinstance(fsdp.get("fsdp_sharding_strategy"), int):
        fsdp["fsdp_sharding_strategy"] = FSDP_SHARDING_BY_NUMBER.get(fsdp["fsdp_sharding_strategy"], fsdp["fsdp_sharding_strategy"])
    if fsdp.get("fsdp_backward_prefetch") in (None, "NO_PREFETCH") and "fsdp_backward_prefetch" in fsdp:
        fsdp["fsdp_backward_prefetch"] = "NO_PREFETCH"
    if data.get("fsdp_config") is not None or fsdp:
        data["fsdp_config"] = fsdp
    if data.get("num_processes") == -1:  # the peer's "decide at launch time"
        data["num_processes"] = 1
    if data.get("gpu_ids") is None and "gpu_ids" in data:
        data["gpu_ids"] = "all"
    if isinstance(data.get("num_machines"), str) and ":" in data["num_machines"]:  # MIN:MAX: an elastic run
        data["min_machines"], data["num_machines"] = parse_machines(data["num_machines"])
    return data  # a null for a key that cannot be None means its default (see from_dict)
