"""Seeding and RNG synchronisation (``accelerate.utils.random``).

Example:
    >>> from hasten.utils.random import set_seed, synchronize_rng_states
    >>> set_seed(0)
    >>> synchronize_rng_states(["torch"])  # one process: nothing to do
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..options import RNGType
from ..seeding import set_seed

__all__ = ["set_seed", "synchronize_rng_state", "synchronize_rng_states"]


def synchronize_rng_state(rng_type: RNGType | str | None = None, generator: torch.Generator | None = None) -> None:
    """Copy one random number generator's state from process 0 to every process.

    `rng_type` is "torch" (CPU), "cuda" or "generator" (then `generator`);
    the accelerator kinds hasten has no backend for are refused.

    Example:
        >>> synchronize_rng_state("torch")
    """
    kind = RNGType(getattr(rng_type, "value", rng_type) or "torch")
    if kind is RNGType.TORCH:
        get, put = torch.get_rng_state, torch.set_rng_state
    elif kind is RNGType.CUDA:
        if not torch.cuda.is_available():
            return
        get, put = torch.cuda.get_rng_state, torch.cuda.set_rng_state
    elif kind is RNGType.GENERATOR:
        if generator is None:
            raise ValueError("synchronize_rng_state('generator') needs the generator; pass generator=...")
        get, put = generator.get_state, generator.set_state
    else:
        raise ValueError(f"synchronize_rng_state does not know rng_type={kind.value!r} in hasten; "
                         "use 'torch', 'cuda' or 'generator'.")
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return
    from ..collectives import broadcast_object_list

    state: list[Any] = [get() if dist.get_rank() == 0 else None]
    broadcast_object_list(state, 0)
    put(state[0])


def synchronize_rng_states(rng_types: list[RNGType | str], generator: torch.Generator | None = None) -> None:
    """`synchronize_rng_state` for each of `rng_types`.

    Example:
        >>> synchronize_rng_states(["torch", "generator"], generator=torch.Generator())
    """
    for rng_type in rng_types:
        synchronize_rng_state(RNGType(getattr(rng_type, "value", rng_type)), generator=generator)
