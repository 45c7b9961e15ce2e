"""Finding a batch size that fits, and freeing device memory (the peer's paths: ``accelerate.utils.memory``, ``accelerate.memory_utils``).

Example:
    >>> from hasten.runtime.memory import find_executable_batch_size
    >>> @find_executable_batch_size(starting_batch_size=8)
    ... def train(batch_size):
    ...     return batch_size
    >>> train()
    8
"""

from __future__ import annotations

import functools
import gc
import inspect
from typing import Any, Callable

import torch

__all__ = ["clear_device_cache", "find_executable_batch_size", "release_memory", "should_reduce_batch_size"]

# What allocators say when they run out (CUDA, cuDNN, the CPU allocator, MPS, XPU).
_OOM_MESSAGES = ("out of memory", "cudnn error: cudnn_status_not_supported", "defaultcpuallocator: can't allocate memory")


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Empty the accelerator's cache (CUDA / MPS / XPU), after a garbage collection if asked.

    Example:
        >>> clear_device_cache(garbage_collection=True)
    """
    if garbage_collection:
        gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    elif hasattr(torch, "mps") and torch.backends.mps.is_available():
        torch.mps.empty_cache()
    elif hasattr(torch, "xpu") and torch.xpu.is_available():
        torch.xpu.empty_cache()


def release_memory(*objects: Any) -> list[None]:
    """Drop the references passed, collect garbage and empty the device cache; returns as many Nones.

    Example:
        >>> a, b = release_memory(torch.ones(2), torch.ones(3))
        >>> a is None and b is None
        True
    """
    released: list[None] = [None for _ in objects]
    del objects
    clear_device_cache(garbage_collection=True)
    return released


def should_reduce_batch_size(exception: BaseException) -> bool:
    """True when `exception` says the device ran out of memory (`torch.OutOfMemoryError` or an allocator's message).

    Example:
        >>> should_reduce_batch_size(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))
        True
        >>> should_reduce_batch_size(ValueError("bad input"))
        False
    """
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exception, oom_type):
        return True
    if isinstance(exception, RuntimeError) and len(exception.args) == 1:
        message = str(exception.args[0]).lower()
        return any(known in message for known in _OOM_MESSAGES)
    return False


def find_executable_batch_size(function: Callable[..., Any] | None = None, starting_batch_size: int = 128,
                               reduce_batch_size_fn: Callable[[], int] | None = None) -> Callable[..., Any]:
    """Decorator: call `function(batch_size, ...)`, shrinking `batch_size` after each out-of-memory error until it runs.

    The decorated function takes the batch size as its FIRST parameter and
    is called without it. After an out-of-memory error the next try gets 90%
    of the size, rounded down (Accelerate 1.16's step: 128, 115, 103, ...);
    other exceptions are re-raised; reaching batch size 0 raises
    RuntimeError. `reduce_batch_size_fn()` replaces that step (it returns the
    next size). The size that worked is kept for the next call.
    Under several processes, every process must run out of memory at the
    same size (the batch sizes would differ otherwise).

    Example:
        >>> @find_executable_batch_size(starting_batch_size=64)
        ... def train(batch_size, limit):
        ...     if batch_size > limit:
        ...         raise torch.OutOfMemoryError("CUDA out of memory.")
        ...     return batch_size
        >>> train(20)
        19
    """
    if function is None:
        return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size,
                                 reduce_batch_size_fn=reduce_batch_size_fn)
    batch_size = starting_batch_size
    if reduce_batch_size_fn is None:
        def reduce_batch_size_fn() -> int:
            nonlocal batch_size
            batch_size = int(batch_size * 0.9)  # 90% a try, as Accelerate 1.16
            return batch_size

    @functools.wraps(function)
    def decorator(*args: Any, **kwargs: Any) -> Any:
        nonlocal batch_size
        clear_device_cache(garbage_collection=True)
        params = list(inspect.signature(function).parameters)
        if len(params) < len(args) + 1:
            shown = ", ".join(f"{name}={value}" for name, value in zip(params[1:], args[1:]))
            raise TypeError(f"Batch size was passed into `{function.__name__}` as the first argument, but the "
                            f"decorator passes it; call {function.__name__}({shown}) without it.")
        while True:
            if batch_size <= 0:
                raise RuntimeError(f"No executable batch size found, reached zero: {function.__name__} ran out of "
                                   "memory at every batch size down to 1; make the model or inputs smaller.")
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as error:  # noqa: BLE001 - re-raised unless it is an out-of-memory error
                if not should_reduce_batch_size(error):
                    raise
                del error
                clear_device_cache(garbage_collection=True)
                batch_size = reduce_batch_size_fn()

    return decorator
