"""Seeding every random number generator a training run uses, and copying generator states across processes.

The peer's path for these is ``accelerate.utils.random``. torch is imported on first call.

Example:
    >>> from hasten.runtime.seeding import set_seed, synchronize_rng_states
    >>> set_seed(0)
    >>> synchronize_rng_states(["torch"])  # one process: nothing to do
"""

from __future__ import annotations

import os
import random
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import torch

    from ..options import RNGType

__all__ = ["set_seed", "synchronize_rng_state", "synchronize_rng_states"]


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed Python's `random`, NumPy (if installed) and torch (CPU and all GPUs).

    With `device_specific=True` each process adds its rank to the seed, so
    processes draw different random numbers (e.g. for data augmentation).
    With `deterministic=True` torch is asked for deterministic algorithms.

    Example:
        >>> set_seed(42)
        >>> import torch; torch.rand(1).item() == (set_seed(42) or torch.rand(1).item())
        True
    """
    import torch

    if device_specific:
        from ..process.topology import ProcessTopology

        seed += ProcessTopology.from_env().rank
    random.seed(seed)
    os.environ.setdefault("PYTHONHASHSEED", str(seed))
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def synchronize_rng_state(rng_type: RNGType | str, generator: torch.Generator | None = None) -> None:
    """Copy one random number generator's state from process 0 to every process.

    `rng_type` is "torch" (CPU), "generator" (then `generator`), or the device type of this machine's
    accelerator ("cuda", "xpu", "mps", ...: its default generator, as Accelerate 1.16 takes any device name).
    Naming a device this machine does not have raises AssertionError (as Accelerate's assertion does); "xla"
    is refused (hasten has no TPU backend).

    Example:
        >>> synchronize_rng_state("torch")
    """
    import torch
    import torch.distributed as dist

    from ..core.accelerators import get_torch_accelerator_backend

    kind = str(getattr(rng_type, "value", rng_type))
    get: Callable[[], torch.Tensor]
    put: Callable[[torch.Tensor], Any]
    if kind == "torch":
        get, put = torch.get_rng_state, torch.set_rng_state
    elif kind == "generator":
        if generator is None:
            raise ValueError("synchronize_rng_state('generator') needs the generator; pass generator=...")
        get, put = generator.get_state, generator.set_state
    elif kind == "xla":
        raise ValueError("synchronize_rng_state('xla'): hasten has no TPU / XLA backend; use 'torch', 'generator' or "
                         "this machine's accelerator type.")
    else:
        device_type, module = get_torch_accelerator_backend()
        if device_type != kind:
            raise AssertionError(f"Can't synchronize {kind.upper()} seeds without that device: this machine's "
                                 f"accelerator is {device_type or 'none'}; name its type, or 'torch'.")
        module = torch.get_device_module(device_type) if module is torch.accelerator else module
        get, put = module.get_rng_state, module.set_rng_state
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return
    from .collectives import broadcast_object_list

    state: list[Any] = [get() if dist.get_rank() == 0 else None]
    broadcast_object_list(state, 0)
    put(state[0])


def synchronize_rng_states(rng_types: list[RNGType | str], generator: torch.Generator | None = None) -> None:
    """`synchronize_rng_state` for each of `rng_types`.

    Example:
        >>> import torch
        >>> synchronize_rng_states(["torch", "generator"], generator=torch.Generator())
    """
    for rng_type in rng_types:
        synchronize_rng_state(rng_type, generator=generator)
