"""Writing files atomically: safetensors for tensor dicts, torch.save otherwise."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from .atomic import atomic_write

__all__ = ["save", "load", "atomic_write", "is_tensor_dict"]


def is_tensor_dict(obj: Any) -> bool:
    """True for a non-empty mapping of str to tensors (what safetensors can store)."""
    return (
        isinstance(obj, Mapping)
        and bool(obj)
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())
    )


def _safetensors_dict(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU copies; tensors sharing storage (tied weights) are cloned so safetensors accepts them."""
    seen: set[tuple[int, int]] = set()
    out = {}
    for name, tensor in tensors.items():
        tensor = tensor.detach()
        key = (tensor.untyped_storage().data_ptr(), tensor.device.index or 0)
        if key in seen or not tensor.is_contiguous():
            tensor = tensor.clone().contiguous()
        seen.add(key)
        out[name] = tensor.cpu()
    return out


def save(obj: Any, f: str | os.PathLike[str], safe_serialization: bool | None = None) -> None:
    """Save `obj` to `f` atomically (on every process that calls it; `Accelerator.save` calls it on main only).

    `safe_serialization=None` picks safetensors when `obj` is a dict of
    tensors and `f` ends in ``.safetensors``; True requires a tensor dict;
    False always uses `torch.save`.

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
        >>> save({"w": torch.ones(2)}, path)
        >>> from safetensors.torch import load_file; load_file(path)["w"]
        tensor([1., 1.])
    """
    tensor_dict = is_tensor_dict(obj)
    if safe_serialization is None:
        safe_serialization = tensor_dict and str(f).endswith(".safetensors")
    if safe_serialization:
        if not tensor_dict:
            raise ValueError(
                f"safetensors can only store a dict of str -> tensor, not a {type(obj).__name__}; "
                "pass safe_serialization=False to use torch.save."
            )
        try:
            from safetensors.torch import save_file
        except ImportError:
            raise ImportError("saving .safetensors files needs the safetensors package: pip install safetensors") from None
        tensors = _safetensors_dict(obj)
        atomic_write(f, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    else:
        atomic_write(f, lambda tmp: torch.save(obj, tmp))


def load(f: str | os.PathLike[str], map_location: Any = None, **kwargs: Any) -> Any:
    """Read what `save` wrote: safetensors files as tensor dicts, others with ``torch.load(weights_only=True)``.

    Nothing is unpickled by default; pass ``weights_only=False`` only for a
    file you trust.

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "state.pt")
        >>> save({"step": 3}, path); load(path)
        {'step': 3}
    """
    if str(f).endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(f, device="cpu" if map_location is None else str(map_location))
    kwargs.setdefault("weights_only", True)
    return torch.load(f, map_location=map_location, **kwargs)
