"""hasten: one unchanged PyTorch training loop on a CPU, one GPU, many GPUs or many machines.

Public names are imported lazily (on first attribute access), so
``import hasten`` costs almost nothing and the CLI prints help without
importing torch.

Example:
    >>> from hasten import Accelerator
    >>> accelerator = Accelerator(cpu=True)
"""

from __future__ import annotations

import os as _os
from typing import TYPE_CHECKING

from .core.lazy import lazy_exports

__version__ = "1.16.0"

if _os.environ.get("ACCELERATE_ENABLE_RICH", "").lower() in ("1", "true", "yes", "on"):  # as `import accelerate` does
    from .core import availability as _availability

    if _availability.is_rich_available():
        from .core import rich_traceback  # noqa: F401  (installs rich's traceback handler)

# public name -> module that defines it
_EXPORTS = {
    "Accelerator": "accelerator",
    "PartialState": "runtime.state",
    "ProcessTopology": "process.topology",
    "LaunchSpec": "process.launch_spec",
    "DistributedType": "options",
    "DataLoaderConfiguration": "options",
    "GradientAccumulationPlugin": "options",
    "DistributedDataParallelKwargs": "options",
    "InitProcessGroupKwargs": "options",
    "GradScalerKwargs": "options",
    "ProfileKwargs": "options",
    "ProjectConfiguration": "checkpointing.project",
    "set_seed": "runtime.seeding",
    "ThroughputMeter": "runtime.throughput",
    "skip_first_batches": "data",
    "notebook_launcher": "launch.notebook",
    "debug_launcher": "launch.notebook",
    "AcceleratorState": "runtime.accelerator_state",
    "FullyShardedDataParallelPlugin": "strategies.fsdp.plugin",
    "DeepSpeedPlugin": "strategies.deepspeed.plugin",
    "ParallelismConfig": "strategies.parallel.mesh",
    "AutocastKwargs": "options",
    "DDPCommunicationHookType": "options",
    "find_executable_batch_size": "runtime.memory",
    "synchronize_rng_states": "runtime.seeding",
    "load_checkpoint_in_model": "big_modeling.loading",
    "init_empty_weights": "big_modeling.dispatch",
    "init_on_device": "big_modeling.dispatch",
    "cpu_offload": "big_modeling.dispatch",
    "cpu_offload_with_hook": "big_modeling.dispatch",
    "disk_offload": "big_modeling.dispatch",
    "dispatch_model": "big_modeling.dispatch",
    "load_checkpoint_and_dispatch": "big_modeling.dispatch",
    "infer_auto_device_map": "big_modeling.device_map",
    "is_rich_available": "core.availability",
}

__all__ = sorted(_EXPORTS) + ["__version__"]
__getattr__, _ = lazy_exports(__name__, _EXPORTS, globals())


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # for type checkers and IDEs only
    from .accelerator import Accelerator
    from .data import skip_first_batches
    from .launch.notebook import debug_launcher, notebook_launcher
    from .process.launch_spec import LaunchSpec
    from .options import (
        AutocastKwargs,
        DDPCommunicationHookType,
        DataLoaderConfiguration,
        DistributedDataParallelKwargs,
        DistributedType,
        GradientAccumulationPlugin,
        GradScalerKwargs,
        InitProcessGroupKwargs,
        ProfileKwargs,
    )
    from .checkpointing.project import ProjectConfiguration
    from .runtime.accelerator_state import AcceleratorState
    from .runtime.state import PartialState
    from .runtime.seeding import set_seed
    from .runtime.throughput import ThroughputMeter
    from .strategies.fsdp.plugin import FullyShardedDataParallelPlugin
    from .process.topology import ProcessTopology
