"""What reading a checkpoint gives before anything is applied, and the checks that read makes.

`load.py` (hasten's own checkpoints) and `foreign.py` (folders written by
Accelerate) both read into a `CheckpointContents`, checked with
`check_model` / `check_optimizer`, through `ReadOptions`.

Example:
    >>> import torch
    >>> check_model("model.safetensors", {"w": torch.zeros(2)}, {"w": torch.zeros(2)})  # fits: no error
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .commit import CheckpointError
from .state import read_pickle

__all__ = ["CheckpointContents", "ReadOptions", "check_model", "check_optimizer", "fill_tied"]


@dataclass
class CheckpointContents:
    """Everything read from a checkpoint, checked, and not yet applied."""

    path: Path
    manifest: dict[str, Any]
    models: list[tuple[Any, dict[str, torch.Tensor]]] = field(default_factory=list)
    optimizers: list[dict[str, Any]] = field(default_factory=list)
    schedulers: list[dict[str, Any]] = field(default_factory=list)
    dataloaders: list[dict[str, Any]] = field(default_factory=list)
    loader_states: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)  # torchdata's (Accelerate's folders)
    scaler: dict[str, Any] | None = None
    custom: list[dict[str, Any]] = field(default_factory=list)
    rng: dict[str, Any] | None = None
    gradients: dict[str, torch.Tensor] = field(default_factory=dict)
    sharded: Any = None  # what a sharded strategy read (its own files), not yet applied
    foreign: bool = False  # written by Accelerate


@dataclass
class ReadOptions:
    """How pickled files are read: ``weights_only`` unless trusted, plus torch.load's other arguments."""

    trust: bool = False
    load_kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_load_kwargs(cls, load_kwargs: dict[str, Any] | None) -> "ReadOptions":
        extra = dict(load_kwargs or {})
        extra.pop("map_location", None)  # hasten reads to the CPU and copies into place
        return cls(trust=extra.pop("weights_only", True) is False, load_kwargs=extra)

    def read(self, path: Path, name: str) -> Any:
        return read_pickle(path, name, self.trust, **self.load_kwargs)


def _same_tensor(value: Any) -> tuple[Any, ...] | None:
    """What two names of one tied weight share (address, shape, strides); None where it cannot be known."""
    local = getattr(value, "_local_tensor", value)  # a DTensor's own shard
    if not isinstance(local, torch.Tensor) or local.is_meta or local.data_ptr() == 0:
        return None
    return local.device, local.data_ptr(), tuple(local.shape), local.stride()


def fill_tied(saved: dict[str, torch.Tensor], expected: dict[str, Any]) -> None:
    """Give each name a tied weight has in the model, and that the file stores once, its twin's tensor.

    Accelerate (and safetensors' own saving) keep only the first name of
    tensors that share memory (``lm_head.weight`` tied to the embedding), so
    its checkpoints lack the others; the model's live tensors say which.

    Example:
        >>> shared = torch.zeros(2)
        >>> saved = {"a": torch.ones(2)}
        >>> fill_tied(saved, {"a": shared, "b": shared}); sorted(saved)
        ['a', 'b']
    """
    present: dict[tuple[Any, ...] | None, str] = {}
    for name, value in expected.items():
        key = _same_tensor(value)
        if key is not None and name in saved:
            present.setdefault(key, name)
    for name, value in expected.items():
        twin = present.get(_same_tensor(value)) if name not in saved else None
        if twin is not None:
            saved[name] = saved[twin]


def check_model(name: str, saved: dict[str, torch.Tensor], expected: dict[str, Any]) -> None:
    """Same keys and shapes as the model, or one error naming the first differences."""
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


def check_optimizer(name: str, saved: dict[str, Any], optimizer: Any) -> None:
    """Same parameter groups and state shapes as the optimizer, or one error."""
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
