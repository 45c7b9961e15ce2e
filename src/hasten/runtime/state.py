"""Process-level state: topology, device, process group, and rank helpers (Accelerate's ``PartialState``).

`PartialState` is usable without an `Accelerator`. It is NOT a Borg: each
instance holds its own settings. The only process-wide resource is torch's
process group, which `hasten.process.group` creates once (or adopts when
the user created it) and tears down cleanly at exit.
"""

from __future__ import annotations

import contextlib
import functools
import os
from datetime import timedelta
from typing import Any, Callable, ClassVar, Iterator, TypeVar

import torch
import torch.distributed as dist

from ..process.launch_spec import LaunchSpec, cpu_affinity_requested, debug_requested, torch_device_from_env
from ..process.group import (
    DEFAULT_TIMEOUT,
    init_process_group,
    shutdown_process_group,
    start_watchdog,
    topology_from_group,
)
from ..process.topology import ProcessTopology, backend_for_device, select_device

__all__ = ["PartialState"]

F = TypeVar("F", bound=Callable[..., Any])



# What an Accelerator told every PartialState of this process (its distributed type): the first of the
# peer's two levels of shared facts (the second, the run's decisions, is `accelerator_state._run_facts`).
_partial_facts: dict[str, Any] = {}
_generation = [0]  # bumped by `PartialState._reset_state()`


class PartialState:
    """Rank, world size, device and synchronisation helpers for this process.

    Creating it joins (or adopts) the process group when the environment
    describes more than one process.

    Example:
        >>> state = PartialState(cpu=True)
        >>> state.num_processes, state.process_index
        (1, 0)
        >>> with state.main_process_first():
        ...     pass
    """

    # Accelerate's shared-state dict, which scripts and its tests read: what the newest PartialState of this
    # process set up, empty until one is created and after `_reset_state()` (each instance keeps its own settings).
    _shared_state: ClassVar[dict[str, Any]] = {}

    def __init__(
        self,
        cpu: bool | None = None,
        backend: str | None = None,
        timeout: timedelta | None = None,
        topology: ProcessTopology | None = None,
    ) -> None:
        spec = LaunchSpec.current()
        self.cpu = spec.cpu if cpu is None else cpu
        self.debug = debug_requested()
        if dist.is_available() and dist.is_initialized():
            self.topology = topology_from_group()
            self.backend: str | None = dist.get_backend()
        else:
            self.topology = ProcessTopology.from_env() if topology is None else topology
            self.backend = None
        named = torch_device_from_env()  # Accelerate's ACCELERATE_TORCH_DEVICE overrides the choice
        self.device = torch.device(named) if named else select_device(self.topology.local_rank, cpu=self.cpu)
        if named and self.device.type != "cpu":
            getattr(torch, self.device.type).set_device(self.device)
        if cpu_affinity_requested():  # the cores next to this process's GPU, as Accelerate (nothing to pin on CPUs)
            from ..process import affinity

            affinity.set_numa_affinity(self.topology.local_rank)
        wanted = backend or backend_for_device(self.device.type)
        if self.backend is None:
            if self.debug:  # torch's own check that every rank runs the same collective, with shapes
                os.environ.setdefault("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
            # An elastic run has a group even at one process: its engine (FSDP2's sharded checkpoints) stays the same
            # at every size, so what one size saved, another loads.
            if self.topology.is_distributed or (spec.elastic is not None and self.topology.launcher == "torchrun"):
                if self.device.type == "cuda" and not named:
                    torch.cuda.set_device(self.device)
                # The user's timeout, else Accelerate's default, in an elastic run too: a peer that computes for long
                # is waited for. A lost machine is found from signs of life instead (hasten.launch.peer_watch).
                init_process_group(self.topology, wanted, timeout or DEFAULT_TIMEOUT)
                self.backend = wanted
        elif backend is not None and backend != self.backend:
            raise RuntimeError(
                f"the process group already uses backend {self.backend!r} but {backend!r} was asked for; "
                "create every Accelerator/PartialState of a process with the same backend and cpu setting."
            )
        elif self.device.type == "cpu" and self.backend == "nccl":
            raise RuntimeError(
                "the process group uses nccl, which cannot exchange CPU tensors, but this Accelerator computes on "
                "the CPU; drop cpu=True or create the process group with backend='gloo'."
            )
        elif self.device.type == "cuda" and self.backend == "gloo" and not self.cpu:
            raise RuntimeError(
                "the process group uses gloo but this process computes on CUDA; "
                "pass cpu=True or create the process group with backend='nccl'."
            )
        if self.topology.is_distributed:
            start_watchdog()
        self._generation = _generation[0]
        PartialState._shared_state.clear()
        PartialState._shared_state.update(_cpu=self.cpu, device=self.device, backend=self.backend, debug=self.debug)

    def _check_alive(self, name: str) -> None:
        """A `PartialState` made before `PartialState._reset_state()` refuses to answer, as the peer's (whose state was cleared)."""
        if self.__dict__.get("_generation", _generation[0]) != _generation[0]:
            raise AttributeError(
                f"`PartialState` object has no attribute `{name}`. This happens if `PartialState._reset_state()` was "
                "called and no `PartialState` or `Accelerator` was created since; create a new one.")

    # -- who am I -----------------------------------------------------------
    @property
    def num_processes(self) -> int:
        self._check_alive("num_processes")
        return self.topology.world_size

    @property
    def process_index(self) -> int:
        self._check_alive("process_index")
        return self.topology.rank

    @property
    def local_process_index(self) -> int:
        self._check_alive("local_process_index")
        return self.topology.local_rank

    @property
    def use_distributed(self) -> bool:
        return self.topology.is_distributed

    @property
    def is_main_process(self) -> bool:
        return self.topology.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self.topology.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return self.topology.is_last_process

    # -- synchronisation ----------------------------------------------------
    def wait_for_everyone(self) -> None:
        """Block until every process reaches this line (a barrier).

        In debug mode it first checks that every process is at a barrier
        (not one here and another in a gather), and says where each is if not.
        """
        if self.use_distributed:
            from ..process import watchdog

            with watchdog.waiting("wait_for_everyone"):
                if self.debug:
                    from .collectives import check_same_everywhere

                    check_same_everywhere("wait_for_everyone", None)
                dist.barrier()

    @contextlib.contextmanager
    def _first(self, leader: bool) -> Iterator[None]:
        if not leader:
            self.wait_for_everyone()
        yield
        if leader:
            self.wait_for_everyone()

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Run the block on the main process first, then on all others (e.g. to download or cache)."""
        return self._first(self.is_main_process)

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Run the block on each node's local main process first, then on the others."""
        return self._first(self.is_local_main_process)

    def _only_when(self, condition: Callable[[], bool], function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if condition():
                return function(*args, **kwargs)
            return None

        return wrapper  # type: ignore[return-value]

    def on_main_process(self, function: F) -> F:
        """Decorator: run the function on the main process only (others get None)."""
        return self._only_when(lambda: self.is_main_process, function)

    def on_local_main_process(self, function: F) -> F:
        """Decorator: run the function on each node's local main process only."""
        return self._only_when(lambda: self.is_local_main_process, function)

    def on_last_process(self, function: F) -> F:
        """Decorator: run the function on the last process only."""
        return self._only_when(lambda: self.is_last_process, function)

    def on_process(self, function: F | None = None, process_index: int = 0):
        """Decorator: run the function on process `process_index` only.

        Example:
            >>> state = PartialState(cpu=True)
            >>> @state.on_process(process_index=0)
            ... def hello():
            ...     return "hi"
            >>> hello()
            'hi'
        """
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return self._only_when(lambda: self.process_index == process_index, function)

    def on_local_process(self, function: F | None = None, local_process_index: int = 0):
        """Decorator: run the function on local process `local_process_index` of each node only."""
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        return self._only_when(lambda: self.local_process_index == local_process_index, function)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """`print` on the local main process only."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Give each process its contiguous share of a list, tuple, dict of lists, or tensor.

        Shares differ by at most one element; with `apply_padding=True` the
        shorter shares repeat their last element so every process gets the
        same count (useful before `gather`).

        Example:
            >>> state = PartialState(cpu=True)
            >>> with state.split_between_processes(["a", "b", "c"]) as mine:
            ...     mine
            ['a', 'b', 'c']
        """
        from .collectives import split_for_process

        yield split_for_process(inputs, self.process_index, self.num_processes, apply_padding)

    def destroy_process_group(self) -> None:
        """Barrier, then destroy the process group (safe to call more than once)."""
        shutdown_process_group(success=True)

    @property
    def distributed_type(self) -> Any:
        """The kind of run, as the peer reports it from `PartialState()`.

        Before any Accelerator: NO for one process, DEEPSPEED when launched
        with DeepSpeed, else MULTI_GPU (CUDA) or MULTI_CPU. Once an Accelerator
        exists: what it chose (e.g. FSDP), until `PartialState._reset_state()`.

        Example:
            >>> PartialState(cpu=True).distributed_type.value
            'NO'
        """
        return self._launched_or_told()

    @distributed_type.setter
    def distributed_type(self, value: Any) -> None:
        _partial_facts["distributed_type"] = value

    def _launched_or_told(self) -> Any:
        """What an Accelerator told every `PartialState`, else what the environment implies."""
        return _partial_facts.get("distributed_type") or self._launched_type()

    def _launched_type(self) -> Any:
        """The distributed type the environment alone implies (no Accelerator asked yet)."""
        from ..options import DistributedType

        if LaunchSpec.current().deepspeed is not None:
            return DistributedType.DEEPSPEED
        if not self.use_distributed:
            return DistributedType.NO
        return DistributedType.MULTI_GPU if self.device.type == "cuda" else DistributedType.MULTI_CPU

    @staticmethod
    def _reset_state() -> None:
        """Forget what Accelerators told every `PartialState` (its distributed type): the peer's test reset.

        Each `PartialState` holds its own settings, so a new one reads the
        environment again; the process group, the one process-wide
        resource, is left alone (use `destroy_process_group` to leave it).

        Example:
            >>> PartialState._reset_state(); PartialState(cpu=True).distributed_type.value
            'NO'
        """
        _partial_facts.clear()
        PartialState._shared_state.clear()
        _generation[0] += 1  # states made before refuse to answer (`_check_alive`); new ones read the environment

    def __repr__(self) -> str:
        t = self.topology
        return (
            f"PartialState(rank={t.rank}, world_size={t.world_size}, local_rank={t.local_rank}, "
            f"device={self.device}, backend={self.backend}, launcher={t.launcher})"
        )
