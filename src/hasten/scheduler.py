"""Accelerate's ``accelerate.scheduler`` path: names only; the code lives in `hasten.runtime.scheduler`.

A prepared scheduler steps as Accelerate's does (``num_processes`` steps of
the wrapped scheduler per optimizer step that happened, once with
``split_batches=True``); `SchedulerKwargs(once_per_optimizer_step=True)` is
hasten's opt-in for one step per optimizer step.

Example:
    >>> from hasten import Accelerator
    >>> from hasten.scheduler import SchedulerKwargs
    >>> accelerator = Accelerator(cpu=True, kwargs_handlers=[SchedulerKwargs(once_per_optimizer_step=True)])
"""

from __future__ import annotations

from .runtime.scheduler import AcceleratedScheduler, SchedulerKwargs

__all__ = ["AcceleratedScheduler", "SchedulerKwargs"]
