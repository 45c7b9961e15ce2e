"""The peer's ``accelerate.utils.torch_xla`` path: hasten has no TPU / XLA backend, so `install_xla` refuses.

The code lives in `hasten.core.unavailable`.

Example:
    >>> from hasten.utils.torch_xla import install_xla
    >>> install_xla()
    Traceback (most recent call last):
    ...
    NotImplementedError: install_xla needs TPUs through torch_xla, which hasten does not support; run on CPUs or CUDA GPUs instead.
"""

from ..core.unavailable import install_xla

__all__ = ["install_xla"]
