"""The Accelerator's process part: who and where, collectives, and "only on process N" helpers.

Everything here delegates: collectives to `hasten.runtime.collectives`, process
facts and helpers to the `AcceleratorState`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

import torch


def _collectives() -> ModuleType:
    """The collectives module, imported at the first collective: a script that never gathers does not load it."""
    from ..runtime import collectives

    return collectives


if TYPE_CHECKING:
    from ..runtime.gradient_state import GradientState
    from ..runtime.accelerator_state import AcceleratorState

__all__ = ["ProcessPart"]


class ProcessPart:
    """Rank and world, gather / reduce / broadcast, barriers and "only on process N" helpers.

    Example:
        >>> from hasten import Accelerator
        >>> accelerator = Accelerator(cpu=True)
        >>> accelerator.gather(torch.ones(2)).tolist(), accelerator.num_processes
        ([1.0, 1.0], 1)
    """

    # Shared values this part reads (set once by `Accelerator.__init__`).
    state: AcceleratorState
    gradient_state: GradientState  # gather_for_metrics: is this the loader's last batch?

    # -- who and where ----------------------------------------------------------------
    @property
    def num_processes(self) -> int:
        """How many processes run this script."""
        return self.state.num_processes

    @property
    def process_index(self) -> int:
        """This process's rank among all processes (0 is the main process)."""
        return self.state.process_index

    @property
    def local_process_index(self) -> int:
        """This process's rank on its machine."""
        return self.state.local_process_index

    @property
    def is_main_process(self) -> bool:
        """True on the main process (rank 0)."""
        return self.state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        """True on the main process of this machine."""
        return self.state.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        """True on the process with the highest rank."""
        return self.state.is_last_process

    @property
    def use_distributed(self) -> bool:
        """True when more than one process runs (collectives go over a process group)."""
        return self.state.use_distributed

    @property
    def multi_device(self) -> bool:
        """True when several accelerator devices (GPUs) train together; False on CPU processes and on one device.

        Example:
            >>> from hasten import Accelerator
            >>> Accelerator(cpu=True).multi_device
            False
        """
        return self.use_distributed and self.state.distributed_type == "MULTI_GPU"

    @property
    def deepspeed_plugin(self) -> Any:
        """The `DeepSpeedPlugin` this run uses (None without DeepSpeed)."""
        return self.state.deepspeed_plugin

    @property
    def is_fsdp2(self) -> bool:
        """True when models are sharded by FSDP2 (every FSDP run in hasten).

        Example:
            >>> from hasten import Accelerator
            >>> Accelerator(cpu=True).is_fsdp2
            False
        """
        return self.state.is_fsdp2

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        """True when the run composes parallelisms on one device mesh (Accelerate's test: an FSDP2 run).

        Example:
            >>> from hasten import Accelerator
            >>> Accelerator(cpu=True).is_composable_parallelism_enabled
            False
        """
        return self.state.is_fsdp2

    @property
    def should_save_model(self) -> bool:
        """Whether this process takes part in saving the model: True on every process, as in Accelerate 1.16.

        Accelerate's (commented-out) plan is to skip the replicas of an N-D mesh;
        its 1.16 returns True whenever a `parallelism_config` is set, else
        `is_local_main_process`, and so does hasten.
        """
        if self.state.parallelism_config is None:
            return self.state.is_local_main_process
        return True

    # -- collectives ---------------------------------------------------------------
    def gather(self, tensor: Any) -> Any:
        """Concatenate tensors (in nested structures) from all processes along dim 0."""
        return _collectives().gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """`gather`, minus the samples repeated to complete the last global batch (Accelerate's rule).

        At the last batch of a prepared loader the gathered rows are cut to
        the loader's `remainder` (``len(dataset) % total_batch_size``) when
        it is positive, so over a whole evaluation loader the gathered items
        add up to `len(dataset)`; a loader that drops its last batch, or
        whose dataset has no length, is returned as gathered. Anything that
        is not tensors (in lists, tuples, dicts), or `use_gather_object=True`,
        goes through `gather_object`. Under tensor (or context) parallelism the
        processes of one group read the same batch, so it is gathered once per
        data-parallel rank (Accelerate gathers every process's copy).
        """
        use_gather_object = use_gather_object or not _only_tensors(input_data)
        config = self.state.parallelism_config
        # tp/cp ranks hold copies of one batch; sp ranks (DeepSpeed Ulysses) hold different pieces of it, kept
        repeats = config.tp_size * config.cp_size if config is not None else 1
        if repeats > 1:  # a tp/cp group read one batch: keep one copy (its first process's; the group is innermost)
            if use_gather_object:
                parts = _collectives().gather_object([input_data])[::repeats]
                data = [item for part in parts for item in part] if isinstance(input_data, (list, tuple)) else parts
            else:
                world = self.state.num_processes
                data = _collectives().recursively_apply(lambda t: t.unflatten(0, (world, -1))[::repeats].flatten(0, 1),
                                                     _collectives().gather(input_data))
        else:
            data = _collectives().gather_object(input_data) if use_gather_object else _collectives().gather(input_data)
        state = self.gradient_state
        if not state.end_of_dataloader:
            return data
        remainder = state.remainder
        if remainder <= 0:  # -1: no length or the last batch was dropped; 0: nothing was repeated
            return data
        try:
            if use_gather_object:
                return data[:remainder]
            return _collectives().recursively_apply(lambda t: t[:remainder], data)
        except Exception:  # something that cannot be cut (as Accelerate, hand it back whole)
            return data

    def gather_object(self, obj: Any) -> list[Any]:
        """Gather picklable objects from all processes into one list."""
        return _collectives().gather_object(obj)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Sum or average tensors across processes."""
        return _collectives().reduce(tensor, reduction, scale)

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
        """Pad tensors along `dim` to the largest size on any process."""
        return _collectives().pad_across_processes(tensor, dim, pad_index, pad_first)

    def broadcast(self, tensor: Any, from_process: int = 0) -> Any:
        """Copy tensors from one process to all."""
        return _collectives().broadcast(tensor, from_process)

    def broadcast_object_list(self, objects: list[Any], from_process: int = 0) -> list[Any]:
        """Copy a list of picklable objects from one process to all (in place)."""
        return _collectives().broadcast_object_list(objects, from_process)

    # -- process helpers (delegated to the state) ------------------------------------------
    def wait_for_everyone(self) -> None:
        """Barrier: continue when all processes got here."""
        self.state.wait_for_everyone()

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """The main process runs the block first, then the others (e.g. to download or preprocess once)."""
        return self.state.main_process_first()

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Each machine's main process runs the block first, then that machine's others."""
        return self.state.local_main_process_first()

    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> contextlib.AbstractContextManager[Any]:
        """This process's share of `inputs` (a list, tuple, dict of lists or tensor), as a block."""
        return self.state.split_between_processes(inputs, apply_padding)

    def on_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: `function` runs on the main process only."""
        return self.state.on_main_process(function)

    def on_local_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: `function` runs on each machine's main process only."""
        return self.state.on_local_main_process(function)

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: `function` runs on the last process only."""
        return self.state.on_last_process(function)

    def on_process(self, function: Callable[..., Any] | None = None, process_index: int = 0) -> Any:
        """Decorator: `function` runs on the process with rank `process_index` only."""
        return self.state.on_process(function, process_index=process_index)

    def on_local_process(self, function: Callable[..., Any] | None = None, local_process_index: int = 0) -> Any:
        """Decorator: `function` runs on the process with local rank `local_process_index` only."""
        return self.state.on_local_process(function, local_process_index=local_process_index)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """`print` on the local main process only."""
        self.state.print(*args, **kwargs)


def _only_tensors(data: Any) -> bool:
    if isinstance(data, torch.Tensor):
        return True
    if isinstance(data, (list, tuple)):
        return all(_only_tensors(item) for item in data)
    if isinstance(data, Mapping):
        return all(_only_tensors(item) for item in data.values())
    return False
