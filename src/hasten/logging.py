"""`get_logger`: a logger that prints once per run, not once per process.

Records are emitted on the main process only, unless a call passes
``main_process_only=False`` (every process logs, the rank in front) or
``in_order=True`` (every process, rank by rank). The level comes from
`log_level`, else ``HASTEN_LOG_LEVEL`` / ``ACCELERATE_LOG_LEVEL``.

Unlike the peer library, it needs no `Accelerator` or `PartialState` first:
the rank is read from the launcher's environment (torchrun, MPI, SLURM),
which every process has from its start, so module-level loggers work.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, MutableMapping

from .process.launch_spec import log_level_from_env

__all__ = ["get_logger", "MultiProcessAdapter"]


@functools.lru_cache(maxsize=1)
def _rank() -> int:
    from .process.topology import ProcessTopology

    try:
        return ProcessTopology.from_env().rank
    except ValueError:
        return 0


class MultiProcessAdapter(logging.LoggerAdapter):
    """A `logging.LoggerAdapter` that knows which process it runs on.

    Example:
        >>> logger = get_logger("demo")
        >>> logger.info("printed on the main process only")
        >>> logger.info("printed on every process", main_process_only=False)
    """

    @staticmethod
    def _should_log(main_process_only: bool) -> bool:
        return not main_process_only or _rank() == 0

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        kwargs.setdefault("stacklevel", 2)
        if not self.isEnabledFor(level):
            if in_order:  # every process must still reach every barrier
                _in_turn(lambda: None)
            return
        if in_order:
            _in_turn(lambda: self.logger.log(level, *self._prefixed(msg, kwargs), *args, **kwargs))
            return
        if self._should_log(main_process_only):
            if not main_process_only:
                msg, kwargs = self._prefixed(msg, kwargs)
            self.logger.log(level, msg, *args, **kwargs)

    @staticmethod
    def _prefixed(msg: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        return f"[rank {_rank()}] {msg}", kwargs

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        return msg, kwargs

    @functools.lru_cache(maxsize=None)  # noqa: B019 - one warning per message, as the peer does
    def warning_once(self, *args: Any, **kwargs: Any) -> None:
        """`warning`, but each distinct message only once."""
        self.warning(*args, **kwargs)


def _in_turn(emit: Any) -> None:
    """Run `emit` on rank 0, then rank 1, ... (a barrier between turns when a process group exists)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        emit()
        return
    for turn in range(dist.get_world_size()):
        if dist.get_rank() == turn:
            emit()
        dist.barrier()


def get_logger(name: str, log_level: str | int | None = None) -> MultiProcessAdapter:
    """A logger whose records print on the main process only (per call: `main_process_only`, `in_order`).

    `log_level` (e.g. ``"INFO"``) sets the level; without it the
    ``HASTEN_LOG_LEVEL`` or ``ACCELERATE_LOG_LEVEL`` environment variable
    does, if set.

    Example:
        >>> logger = get_logger(__name__, log_level="INFO")
        >>> logger.info("step %d done", 10)
    """
    if log_level is None:
        log_level = log_level_from_env()
    logger = logging.getLogger(name)
    if log_level is not None:
        level = log_level.upper() if isinstance(log_level, str) else log_level
        if isinstance(level, str) and level not in logging._nameToLevel:  # getLevelNamesMapping is 3.11+
            raise ValueError(f"log_level={log_level!r} is not a logging level; use DEBUG, INFO, WARNING, ERROR or CRITICAL.")
        logger.setLevel(level)
        logger.root.setLevel(level)
    return MultiProcessAdapter(logger, {})
