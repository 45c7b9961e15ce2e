"""Processes die with their launcher: Linux's parent-death signal (PR_SET_PDEATHSIG).

torchrun starts ranks in sessions of their own and mpirun's ranks belong to
mpirun, so a launcher killed hard (SIGKILL) would otherwise leave them
running. Used by the per-rank worker, the notebook workers and the mpirun
child of `hasten launch`.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from typing import Any

from .launch_spec import EXIT_FAILED

__all__ = ["parent_death_signal_available", "arm_parent_death_signal", "die_with_launcher"]

PR_SET_PDEATHSIG = 1


@functools.lru_cache(maxsize=1)
def _prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def parent_death_signal_available() -> bool:
    """True where the signal can be armed (Linux); also loads libc, so a later call in a fork child is cheap.

    Example:
        >>> isinstance(parent_death_signal_available(), bool)
        True
    """
    return _prctl() is not None


def arm_parent_death_signal(expected_parent: int) -> None:
    """Ask for SIGTERM when the parent dies; exit at once if `expected_parent` is already gone (a race)."""
    prctl = _prctl()
    if prctl is None:
        return
    prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    if os.getppid() != expected_parent:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_FAILED)


def die_with_launcher() -> None:
    """Ask Linux to SIGTERM this rank when its launcher dies, even by SIGKILL.

    torchrun starts each rank in a session of its own, so killing the
    launcher's process group would otherwise leave the ranks running; an
    MPI rank's parent is mpirun (or Open MPI's orted), whose SIGKILL would
    leave it running too.

    Example:
        >>> die_with_launcher()  # not started by a launcher: nothing to arm
    """
    launched = ("TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK")
    if any(name in os.environ for name in launched):
        arm_parent_death_signal(os.getppid())
