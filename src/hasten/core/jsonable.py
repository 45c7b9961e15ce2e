"""Small state as JSON, tensors included: never a pickle, so reading it runs no code.

Used for a data loader's position and order in a checkpoint's manifest (Accelerate writes no file for it, so hasten
keeps it in ``hasten_checkpoint.json`` and a checkpoint folder lists exactly Accelerate's files plus the manifest),
and for the small values of the state a live peer sends a joining machine (`process/live/transport.py`).
"""

from __future__ import annotations

import base64
from typing import Any

import torch

__all__ = ["encode", "decode"]


def encode(value: Any) -> Any:
    """A JSON-ready copy of `value` (None, bool, int, float, str, list, tuple, dict, tensor, NumPy scalar or array).

    Example:
        >>> decode(encode({"epoch": 2, "state": torch.arange(3, dtype=torch.uint8), "pair": (1, 2)}))["pair"]
        (1, 2)
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
        return {"__tensor__": str(value.dtype).removeprefix("torch."), "shape": list(value.shape),
                "data": base64.b64encode(data).decode()}
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: encode(v) for k, v in value.items()}
        return {"__items__": [[encode(k), encode(v)] for k, v in value.items()]}
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return {"__ndarray__": encode(torch.from_numpy(np.ascontiguousarray(value)))}
    raise TypeError(f"a {type(value).__name__} cannot be written as JSON (a checkpoint's manifest, a live peer's "
                    "state); state_dict() should hold only tensors, numbers, strings, lists, tuples and dicts.")


def decode(value: Any) -> Any:
    """The value `encode` was given (tensors on the CPU)."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "__tensor__" in value:
        dtype = getattr(torch, str(value["__tensor__"]), None)
        if not isinstance(dtype, torch.dtype):  # (a name from a file or a peer: only a dtype is looked up)
            raise ValueError(f"{value['__tensor__']!r} is not a torch dtype.")
        raw = base64.b64decode(value["data"])
        if not raw:
            return torch.empty(value["shape"], dtype=dtype)
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(value["shape"]).clone()
    if "__tuple__" in value:
        return tuple(decode(v) for v in value["__tuple__"])
    if "__items__" in value:
        return {decode(k): decode(v) for k, v in value["__items__"]}
    if "__ndarray__" in value:
        return decode(value["__ndarray__"]).numpy()
    return {k: decode(v) for k, v in value.items()}
