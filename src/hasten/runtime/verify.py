"""Accelerate's decorators for collective operations in debug mode: `verify_operation` and `chained_operation`.

hasten's own collectives always compare the processes' shapes (cheaply,
see `hasten.runtime.collectives.check_same_everywhere`); these decorators
give a user's function the same check, under Accelerate's rule: only in
debug mode (``ACCELERATE_DEBUG_MODE=1`` / `launch --debug`) on more than one
process. The peer's path is ``accelerate.utils.operations``.

Example:
    >>> import torch
    >>> @verify_operation
    ... def total(tensor):
    ...     return tensor.sum()
    >>> total(torch.ones(3))  # one process: nothing to compare
    tensor(3.)
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

from ..core.errors import DistributedOperationException
from ..process.launch_spec import debug_requested
from . import collectives

__all__ = ["verify_operation", "chained_operation"]

F = TypeVar("F", bound=Callable[..., Any])


def _operation_name(function: Callable[..., Any]) -> str:
    return f"{function.__module__}.{function.__name__}"


def verify_operation(function: F) -> F:
    """Decorate a collective whose first argument (or `tensor=`) holds tensors: in debug mode on several
    processes, check first that they sit on the run's device and have the same shapes on every process.

    A mismatch raises `DistributedOperationException` on every process,
    naming each process's shapes, instead of a hang or a wrong result.

    Example:
        >>> import torch
        >>> verify_operation(lambda tensor: tensor * 2)(torch.ones(1))
        tensor([2.])
    """

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if collectives._distributed() and debug_requested():
            from .state import PartialState

            device = PartialState().device.type
            tensor = kwargs["tensor"] if "tensor" in kwargs else args[0]
            operation = _operation_name(function)
            devices = {t.device.type for t in collectives._leaves(tensor)}
            if devices - {device}:
                raise DistributedOperationException(f"{operation} got tensors on {sorted(devices)} but the run computes "
                                                    f"on {device}; move them to {device} before calling {operation}.")
            collectives.check_same_everywhere(operation, tensor)
        return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def chained_operation(function: F) -> F:
    """Decorate a function built on verified collectives: a `DistributedOperationException` inside it is raised
    again naming this function, with the original as its cause.

    Example:
        >>> @chained_operation
        ... def step():
        ...     raise DistributedOperationException("shapes differ")
        >>> step()
        Traceback (most recent call last):
        ...
        hasten.core.errors.DistributedOperationException: a collective inside hasten.runtime.verify.step failed; see the error above for which processes disagreed.
    """

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except DistributedOperationException as error:
            raise DistributedOperationException(
                f"a collective inside {_operation_name(function)} failed; see the error above for which processes "
                "disagreed.") from error

    return wrapper  # type: ignore[return-value]
