"""Accelerate's `TorchContextParallelConfig` (the `cp_handler` of a `ParallelismConfig`), apart so it imports no torch.

Example:
    >>> from hasten.strategies.parallel.context_config import TorchContextParallelConfig
    >>> TorchContextParallelConfig(cp_comm_strategy="alltoall").cp_comm_strategy
    'alltoall'
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ...core.errors import ConfigError

__all__ = ["TorchContextParallelConfig", "CP_COMM_STRATEGIES"]

CP_COMM_STRATEGIES = ("allgather", "alltoall")


@dataclass
class TorchContextParallelConfig:
    """Options of torch's context parallel (Accelerate's `cp_handler`): how key/value shards travel between ranks.

    Args:
        cp_comm_strategy: ``"allgather"`` (default; env ``PARALLELISM_CONFIG_CP_COMM_STRATEGY``) or ``"alltoall"``,
            handed to torch's ``set_rotate_method`` on CUDA. The CPU path always all-gathers.

    Example:
        >>> TorchContextParallelConfig().cp_comm_strategy
        'allgather'
    """

    cp_comm_strategy: str | None = None

    def __post_init__(self) -> None:
        if self.cp_comm_strategy is None:
            self.cp_comm_strategy = os.environ.get("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "allgather")
        if self.cp_comm_strategy not in CP_COMM_STRATEGIES:
            raise ConfigError(f"Invalid cp_comm_strategy: {self.cp_comm_strategy} is not a context-parallel "
                              f"strategy; use one of {CP_COMM_STRATEGIES}.")
