"""The peer's ``accelerate.utils.memory`` path: names only; the code lives in `hasten.runtime.memory`.

Example:
    >>> from hasten.utils.memory import find_executable_batch_size
    >>> @find_executable_batch_size(starting_batch_size=8)
    ... def train(batch_size):
    ...     return batch_size
    >>> train()
    8
"""

from ..runtime.memory import clear_device_cache, find_executable_batch_size, release_memory, should_reduce_batch_size

__all__ = ["clear_device_cache", "find_executable_batch_size", "release_memory", "should_reduce_batch_size"]
