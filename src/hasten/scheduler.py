"""Accelerate's ``accelerate.scheduler`` path: names only; the code, and how it steps, live in `hasten.runtime.scheduler`.

Example:
    >>> from hasten import Accelerator
    >>> from hasten.scheduler import SchedulerKwargs
    >>> accelerator = Accelerator(cpu=True, kwargs_handlers=[SchedulerKwargs(once_per_optimizer_step=True)])
"""

from __future__ import annotations

from .runtime.scheduler import AcceleratedScheduler, SchedulerKwargs

__all__ = ["AcceleratedScheduler", "SchedulerKwargs"]
