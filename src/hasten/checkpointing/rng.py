"""Every random number generator of a process, as plain values that load with ``weights_only=True``."""

from __future__ import annotations

import random
from typing import Any, cast

import numpy as np
import torch

__all__ = ["capture_rng_state", "restore_rng_state"]


def capture_rng_state() -> dict[str, Any]:
    """Python's `random`, NumPy's global generator, torch's CPU generator and every initialised CUDA generator.

    Example:
        >>> state = capture_rng_state(); first = torch.rand(1)
        >>> restore_rng_state(state); bool(torch.rand(1) == first)
        True
    """
    kind, keys, position, has_gauss, gauss = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())
    state: dict[str, Any] = {
        "random_state": random.getstate(),
        # ndarray is not a weights_only type: keep its numbers in a tensor
        "numpy_random_seed": (kind, torch.from_numpy(keys.astype(np.int64)), int(position), int(has_gauss), float(gauss)),
        "torch_manual_seed": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda_manual_seed"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back what `capture_rng_state` captured (CUDA only where it was captured and is present)."""
    random.setstate(_as_tuples(state["random_state"]))
    kind, keys, position, has_gauss, gauss = state["numpy_random_seed"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, gauss))
    torch.set_rng_state(state["torch_manual_seed"])
    if "torch_cuda_manual_seed" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["torch_cuda_manual_seed"])


def _as_tuples(value: Any) -> Any:
    # random.setstate needs tuples all the way down
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value
