"""Every random number generator of a process, as plain values that load with ``weights_only=True``."""

from __future__ import annotations

import random
from typing import Any, cast

import numpy as np
import torch

__all__ = ["capture_rng_state", "restore_rng_state", "device_rng_states", "restore_device_rng_states"]


def device_rng_states(initialised_only: bool = True) -> dict[str, Any]:
    """The accelerator's generator states under Accelerate 1.16's key, ``torch_<device type>_manual_seed``.

    One key for the device type torch reports (`get_torch_accelerator_backend`); empty without an accelerator.
    With `initialised_only`, CUDA's are taken only once CUDA is initialised (reading them would initialise it).

    Example:
        >>> device_rng_states() if torch.accelerator.current_accelerator() is None else {}
        {}
    """
    from ..core.accelerators import get_torch_accelerator_backend

    device_type, module = get_torch_accelerator_backend()
    if device_type is None or (initialised_only and device_type == "cuda" and not torch.cuda.is_initialized()):
        return {}
    if module is torch.accelerator:
        return {f"torch_{device_type}_manual_seed": torch.get_device_module(device_type).get_rng_state()}
    read = module.get_rng_state if device_type == "mps" else module.get_rng_state_all
    return {f"torch_{device_type}_manual_seed": read()}


def restore_device_rng_states(states: dict[str, Any]) -> None:
    """Put back the accelerator's generator states `device_rng_states` saved; a checkpoint without them is skipped.

    Example:
        >>> restore_device_rng_states({})  # nothing saved for this machine's accelerator: nothing to do
    """
    from ..core.accelerators import get_torch_accelerator_backend

    device_type, module = get_torch_accelerator_backend()
    key = f"torch_{device_type}_manual_seed"
    if device_type is None or key not in states:
        return
    if module is torch.accelerator:
        torch.get_device_module(device_type).set_rng_state(states[key])
    elif device_type == "mps":
        module.set_rng_state(states[key])
    else:
        module.set_rng_state_all(states[key])


def capture_rng_state() -> dict[str, Any]:
    """Python's `random`, NumPy's global generator, torch's CPU generator and the accelerator's (`device_rng_states`).

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
    state.update(device_rng_states())
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back what `capture_rng_state` captured (the accelerator's only where it was captured and is present)."""
    random.setstate(_as_tuples(state["random_state"]))
    kind, keys, position, has_gauss, gauss = state["numpy_random_seed"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, gauss))
    torch.set_rng_state(state["torch_manual_seed"])
    restore_device_rng_states(state)


def _as_tuples(value: Any) -> Any:
    # random.setstate needs tuples all the way down
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value
