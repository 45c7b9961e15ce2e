"""The peer's ``accelerate.utils.imports`` path: the `is_*_available` probes; the code lives in `hasten.core.availability`.

Example:
    >>> from hasten.utils.imports import is_torch_xla_available, is_safetensors_available
    >>> is_torch_xla_available()
    False
"""

from ..core.accelerators import TORCH_DISTRIBUTED_BACKENDS, get_distributed_backend, get_torch_accelerator_backend
from ..core.availability import *  # noqa: F401,F403 - every probe
from ..core.availability import PROBES, torchao_required
from ..strategies.deepspeed.helpers import deepspeed_required

__all__ = [*PROBES, "torchao_required", "deepspeed_required", "get_torch_accelerator_backend", "get_distributed_backend",
           "TORCH_DISTRIBUTED_BACKENDS"]
