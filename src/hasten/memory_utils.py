"""`find_executable_batch_size` and `release_memory` at the peer's older path (``accelerate.memory_utils``).

The code lives in `hasten.runtime.memory`.

Example:
    >>> from hasten.memory_utils import find_executable_batch_size, release_memory
"""

from .runtime.memory import find_executable_batch_size, release_memory

__all__ = ["find_executable_batch_size", "release_memory"]
