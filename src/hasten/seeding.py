"""Seeding every random number generator a training run uses."""

from __future__ import annotations

import os
import random

__all__ = ["set_seed"]


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
        from .topology import ProcessTopology

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
