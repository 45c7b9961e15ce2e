"""`get_logger`: a logger that prints once per run, not once per process; the library's verbosity.

Records are emitted on the main process only, unless a call passes
``main_process_only=False`` (every process logs, the rank in front) or
``in_order=True`` (every process, rank by rank). The level comes from
`log_level`, else ``HASTEN_LOG_LEVEL`` / ``ACCELERATE_LOG_LEVEL``.
`set_verbosity` (and `set_verbosity_debug` / `_info` / `_warning` /
`_error`) sets the level of the library's own loggers, those under
``hasten`` and, as Accelerate 1.16's does, ``accelerate``; `get_verbosity`
reads it back.

Unlike the peer library, it needs no `Accelerator` or `PartialState` first:
the rank is read from the launcher's environment (torchrun, MPI, SLURM),
which every process has from its start, so module-level loggers work.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any, MutableMapping

from .process.launch_spec import log_level_from_env

__all__ = ["get_logger", "MultiProcessAdapter", "get_verbosity", "set_verbosity", "set_verbosity_debug",
           "set_verbosity_info", "set_verbosity_warning", "set_verbosity_error"]

# The library's loggers: hasten's own names, and Accelerate's, which hasten's modules log under with the switch on.
_LIBRARY_LOGGERS = ("hasten", "accelerate")


def get_verbosity() -> int:
    """The effective level of the library's logger (``accelerate`` with the accelerate switch on, else ``hasten``).

    Example:
        >>> import logging
        >>> set_verbosity("info")
        >>> get_verbosity() == logging.INFO
        True
        >>> set_verbosity(logging.NOTSET)  # back to following the root logger
    """
    switched = getattr(sys.modules.get("accelerate"), "__name__", None) == "hasten"
    return logging.getLogger("accelerate" if switched else "hasten").getEffectiveLevel()


def set_verbosity(verbosity: int | str) -> None:
    """Set the level of the library's loggers: a `logging` level or its name in any case (``"warning"``).

    Loggers below them that have no level of their own follow it; loggers given one (by `get_logger`'s
    `log_level`, or ``ACCELERATE_LOG_LEVEL``) keep theirs; the root logger and other libraries' are untouched.

    Example:
        >>> import logging
        >>> set_verbosity(logging.WARNING)
        >>> logging.getLogger("hasten").level == logging.WARNING
        True
        >>> set_verbosity(logging.NOTSET)
    """
    level = verbosity.upper() if isinstance(verbosity, str) else verbosity
    if isinstance(level, str) and level not in logging._nameToLevel:  # getLevelNamesMapping is 3.11+
        raise ValueError(f"set_verbosity({verbosity!r}): not a logging level; use DEBUG, INFO, WARNING, ERROR or "
                         "CRITICAL (or a logging constant).")
    for name in _LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(level)


def set_verbosity_debug() -> None:
    """`set_verbosity(logging.DEBUG)`.

    Example:
        >>> import logging
        >>> set_verbosity_debug()
        >>> get_verbosity() == logging.DEBUG
        True
        >>> set_verbosity(logging.NOTSET)
    """
    set_verbosity(logging.DEBUG)


def set_verbosity_info() -> None:
    """`set_verbosity(logging.INFO)`.

    Example:
        >>> import logging
        >>> set_verbosity_info()
        >>> get_verbosity() == logging.INFO
        True
        >>> set_verbosity(logging.NOTSET)
    """
    set_verbosity(logging.INFO)


def set_verbosity_warning() -> None:
    """`set_verbosity(logging.WARNING)`.

    Example:
        >>> import logging
        >>> set_verbosity_warning()
        >>> get_verbosity() == logging.WARNING
        True
        >>> set_verbosity(logging.NOTSET)
    """
    set_verbosity(logging.WARNING)


def set_verbosity_error() -> None:
    """`set_verbosity(logging.ERROR)`.

    Example:
        >>> import logging
        >>> set_verbosity_error()
        >>> get_verbosity() == logging.ERROR
        True
        >>> set_verbosity(logging.NOTSET)
    """
    set_verbosity(logging.ERROR)


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
