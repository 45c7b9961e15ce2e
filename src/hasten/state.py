"""Accelerate's ``accelerate.state`` path: names only; the code lives in `hasten.runtime.state`
(`PartialState`) and `hasten.runtime.accelerator_state` (`AcceleratorState`).

`GradientState` is defined in `hasten.runtime.gradient_state`, `shutdown_process_group`
in `hasten.process.group`, `do_nothing` and `ThreadLocalSharedDict` in `hasten.core.objects`;
`DistributedType` (which Accelerate's module imports, and scripts import from it) in `hasten.options`.

Example:
    >>> from hasten.state import PartialState
    >>> state = PartialState(cpu=True)
    >>> state.num_processes, state.process_index
    (1, 0)
"""

from __future__ import annotations

from .core.objects import ThreadLocalSharedDict, do_nothing
from .options import DistributedType
from .runtime.gradient_state import GradientState
from .process.group import shutdown_process_group
from .runtime.accelerator_state import AcceleratorState, is_initialized
from .runtime.state import PartialState

__all__ = ["PartialState", "AcceleratorState", "GradientState", "is_initialized", "shutdown_process_group",
           "DistributedType", "ThreadLocalSharedDict", "do_nothing"]
