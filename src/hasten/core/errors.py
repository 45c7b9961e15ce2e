"""hasten's exceptions: one base class, and each kind also the built-in exception it always was.

`HastenError` catches every error hasten raises on purpose (a bad config,
a launch that cannot work, an unusable checkpoint, processes that disagree
about a collective). Each kind also keeps the built-in base it had before
this hierarchy existed (a `ConfigError` is still a `ValueError`, a
`CollectiveDeadlock` still a `RuntimeError`), so `except ValueError:`
clauses written against earlier versions keep catching them. The messages
are one sentence: what is wrong and how to fix it.

This module imports nothing of hasten: every layer may raise these.

Example:
    >>> from hasten.core.errors import ConfigError, HastenError
    >>> try:
    ...     raise ConfigError("num_processes must be at least 1; pass --num_processes 2.")
    ... except HastenError as error:
    ...     isinstance(error, ValueError), str(error)
    (True, 'num_processes must be at least 1; pass --num_processes 2.')
"""

from __future__ import annotations

__all__ = [
    "HastenError",
    "ConfigError",
    "LaunchError",
    "CheckpointError",
    "CheckpointCorrupted",
    "CheckpointWriteError",
    "DeepSpeedConfigError",
    "DistributedOperationException",
    "CollectiveShapeMismatch",
    "CollectiveOrderMismatch",
    "CollectiveDeadlock",
    "CollectiveTimeout",
    "AccelerateSwitchError",
]


class HastenError(Exception):
    """Base class of every error hasten raises on purpose.

    Example:
        >>> issubclass(LaunchError, HastenError) and issubclass(CollectiveTimeout, HastenError)
        True
    """


# -- configuration and launch: raised before (or as) processes start ------------------------------
class ConfigError(HastenError, ValueError):
    """A config file or value that cannot be used; the message names it and says how to fix it.

    Example:
        >>> issubclass(ConfigError, ValueError)
        True
    """


class LaunchError(HastenError, ValueError):
    """A launch request that cannot work; the message says what to change.

    Example:
        >>> issubclass(LaunchError, ValueError)
        True
    """


class DeepSpeedConfigError(HastenError, ValueError):
    """A DeepSpeed config that disagrees with the Accelerator or the prepared objects.

    Example:
        >>> issubclass(DeepSpeedConfigError, ValueError)
        True
    """


# -- checkpoints ------------------------------------------------------------------------------
class CheckpointError(HastenError, ValueError):
    """A checkpoint on disk that cannot be used (missing, partial, damaged, or not matching this run).

    Example:
        >>> issubclass(CheckpointError, ValueError)
        True
    """


class CheckpointCorrupted(CheckpointError):
    """A checkpoint file whose bytes differ from what was saved (its content hash or size no longer matches the manifest).

    ``load_state`` raises it before anything in memory changes;
    ``ProjectConfiguration(fallback_on_damage=True)`` makes automatic
    resume load the newest undamaged checkpoint instead.

    Example:
        >>> issubclass(CheckpointCorrupted, CheckpointError)
        True
    """


class CheckpointWriteError(CheckpointError):
    """``save_state`` could not write its files (disk full, file too large, no permission); the previous checkpoint is kept.

    Every process raises the same error; the message names the reason,
    the checkpoint directory, and the checkpoint that stays the one
    ``load_state`` loads.

    Example:
        >>> issubclass(CheckpointWriteError, CheckpointError)
        True
    """


# -- collectives: processes that disagree or wait forever ----------------------------------------
class DistributedOperationException(HastenError):
    """Processes disagree about a collective (different operations, or different shapes / dtypes); the peer's name.

    hasten raises it as a ValueError (shapes) or RuntimeError (operations)
    as well, so either kind of handler catches it; scripts written for the
    peer catch it by this name.

    Example:
        >>> issubclass(CollectiveShapeMismatch, (DistributedOperationException, ValueError))
        True
    """


class CollectiveShapeMismatch(DistributedOperationException, ValueError):
    """The processes are in the same collective with tensors of different shapes or dtypes.

    Example:
        >>> issubclass(CollectiveShapeMismatch, ValueError)
        True
    """


class CollectiveOrderMismatch(DistributedOperationException, RuntimeError):
    """The processes are in different collectives.

    Example:
        >>> issubclass(CollectiveOrderMismatch, RuntimeError)
        True
    """


class CollectiveDeadlock(HastenError, RuntimeError):
    """The processes wait in different collectives: none can ever continue.

    Example:
        >>> issubclass(CollectiveDeadlock, RuntimeError)
        True
    """


class CollectiveTimeout(HastenError, RuntimeError):
    """A collective reached the process group's timeout; the message says where every process was.

    Example:
        >>> issubclass(CollectiveTimeout, RuntimeError)
        True
    """


class AccelerateSwitchError(HastenError, ImportError):
    """hasten's accelerate switch cannot serve an import: the real package came first, or hasten lacks the module.

    Example:
        >>> issubclass(AccelerateSwitchError, ImportError)
        True
    """
