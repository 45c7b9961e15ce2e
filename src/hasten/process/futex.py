"""Sleeping until a 32-bit word of shared memory changes (Linux futexes), for the host board's waits.

A process waiting on the board for a late one sleeps in the kernel and is
woken by the late one's post, as a process blocked on a socket is woken by
its data, instead of polling: on a loaded machine a polling wait gives its
core away (`sched_yield`) or oversleeps (a timer), and each of those adds
hundreds of microseconds to a collective that takes a few hundred. Where
futexes are not available (another system or CPU) `available` is False and
the board polls.
"""

from __future__ import annotations

import ctypes
import platform
import sys
from typing import Any

__all__ = ["available", "address", "wait", "wake"]

_SYSCALL_NUMBERS = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1  # not FUTEX_PRIVATE_FLAG: the word is shared between processes
_EVERYONE = 2**31 - 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_syscall: Any = None
_number = _SYSCALL_NUMBERS.get(platform.machine().lower(), 0)
if sys.platform == "linux" and _number and sys.byteorder == "little":
    try:
        _syscall = ctypes.CDLL(None, use_errno=True).syscall
        _syscall.restype = ctypes.c_long
    except (OSError, AttributeError):
        _syscall = None

available = _syscall is not None


def address(buffer: Any) -> int:
    """The address of the first byte of a writable buffer (an mmap), for `wait` and `wake`.

    Example:
        >>> address(bytearray(8)) > 0
        True
    """
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))  # the exported view is dropped at once


def wait(where: int, expected: int, seconds: float) -> None:
    """Sleep while the 32-bit word at `where` holds `expected`: until a `wake`, a change, a signal or `seconds` passed.

    Example:
        >>> import mmap
        >>> word = mmap.mmap(-1, 8)
        >>> wait(address(word), 1, 0.001) if available else None  # the word holds 0, not 1: returns at once
    """
    timeout = _Timespec(int(seconds), int((seconds % 1) * 1e9))
    _syscall(ctypes.c_long(_number), ctypes.c_void_p(where), ctypes.c_long(_FUTEX_WAIT),
             ctypes.c_long(expected & 0xFFFFFFFF), ctypes.byref(timeout), ctypes.c_void_p(None), ctypes.c_long(0))


def wake(where: int) -> None:
    """Wake every process sleeping in `wait` on the word at `where`.

    Example:
        >>> import mmap
        >>> wake(address(mmap.mmap(-1, 8))) if available else None
    """
    _syscall(ctypes.c_long(_number), ctypes.c_void_p(where), ctypes.c_long(_FUTEX_WAKE), ctypes.c_long(_EVERYONE),
             ctypes.c_void_p(None), ctypes.c_void_p(None), ctypes.c_long(0))
