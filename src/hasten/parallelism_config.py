"""Accelerate's ``accelerate.parallelism_config`` path: `ParallelismConfig` and `TorchContextParallelConfig`; the
code lives in `hasten.strategies.parallel.mesh` and `.context`.

Example:
    >>> from hasten.parallelism_config import ParallelismConfig
    >>> ParallelismConfig(dp_shard_size=2, tp_size=2).total_size
    4
"""

from .strategies.parallel.context_config import TorchContextParallelConfig
from .strategies.parallel.mesh import MESH_ORDER, ParallelismConfig

__all__ = ["ParallelismConfig", "MESH_ORDER", "TorchContextParallelConfig"]
