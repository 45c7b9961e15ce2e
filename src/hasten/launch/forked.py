"""`PrepareForLaunch`: run a function as process `index` of a forked group (the peer's path: ``accelerate.utils.launch``).

Example:
    >>> from hasten.core.environment import clear_environment
    >>> from hasten.launch.forked import PrepareForLaunch
    >>> with clear_environment():  # it sets rank variables: keep them out of this process
    ...     PrepareForLaunch(print, distributed_type="NO")(0, "hello")
    hello
"""

from __future__ import annotations

import os
from typing import Any, Callable

from ..options import DistributedType

__all__ = ["PrepareForLaunch"]


class PrepareForLaunch:
    """A picklable callable that sets this process's rank variables, then calls `launcher(*args)`.

    For `torch.multiprocessing.start_processes`-style launchers, which call
    `fn(index, *args)`: `LOCAL_RANK` = index and `RANK` = NPROC × NODE_RANK
    + index for a multi-process type; with `debug=True` also `WORLD_SIZE`
    (from the environment). hasten's own `notebook_launcher` does not need it.

    Example:
        >>> import os
        >>> from hasten.core.environment import clear_environment
        >>> with clear_environment():
        ...     PrepareForLaunch(lambda: os.environ["LOCAL_RANK"], distributed_type="MULTI_CPU")(1)
        '1'
    """

    def __init__(self, launcher: Callable[..., Any], distributed_type: str | DistributedType = "NO", debug: bool = False) -> None:
        self.launcher = launcher
        self.distributed_type = DistributedType(getattr(distributed_type, "value", distributed_type))
        self.debug = debug

    def __call__(self, index: int, *args: Any) -> Any:
        if self.debug:
            os.environ.update(LOCAL_RANK=str(index), RANK=str(index), WORLD_SIZE=os.environ.get("WORLD_SIZE", "1"))
        elif self.distributed_type is not DistributedType.NO:
            nproc, node_rank = int(os.environ.get("NPROC", 1)), int(os.environ.get("NODE_RANK", 0))
            os.environ.update(LOCAL_RANK=str(index), RANK=str(nproc * node_rank + index))
        os.environ["FORK_LAUNCHED"] = "1"
        return self.launcher(*args)
