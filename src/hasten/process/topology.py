"""Who am I? Read the process layout from the environment a launcher left.

`ProcessTopology.from_env(env)` is a pure function of a mapping, so every
launcher flavour (torchrun, MPI, SLURM, plain `python`) is testable from a
dict. Device and backend choice are separate small functions that take the
hardware facts as arguments, so their logic is testable on a CPU-only box.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping, overload

__all__ = ["ProcessTopology", "select_device", "backend_for_device", "first_slurm_host"]

DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class ProcessTopology:
    """The place of this process among all processes of a run.

    Example:
        >>> ProcessTopology.from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}).rank
        1
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_MASTER_PORT
    launcher: str = "none"  # none | torchrun | mpi | slurm | process_group

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"rank {self.rank} is outside 0..{self.world_size - 1}; "
                "check the RANK/WORLD_SIZE variables your launcher set."
            )

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main_process(self) -> bool:
        return self.rank == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_rank == 0

    @property
    def is_last_process(self) -> bool:
        return self.rank == self.world_size - 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "ProcessTopology":
        """Build the topology from torchrun, MPI or SLURM variables (in that order).

        Example:
            >>> ProcessTopology.from_env({}).world_size
            1
        """
        env = os.environ if env is None else env
        for reader in (_from_torchrun, _from_mpi, _from_slurm):
            topology = reader(env)
            if topology is not None:
                return topology
        return cls()


@overload
def _int(env: Mapping[str, str], *names: str, default: int) -> int: ...
@overload
def _int(env: Mapping[str, str], *names: str, default: None = None) -> int | None: ...
def _int(env: Mapping[str, str], *names: str, default: int | None = None) -> int | None:
    """The first of `names` that is set (and not empty), as an integer; else `default`."""
    for name in names:
        value = env.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"environment variable {name}={value!r} is not an integer.") from None
    return default


def _required(env: Mapping[str, str], name: str) -> int:
    """A variable the launcher must have set (its presence was checked), as an integer."""
    value = _int(env, name)
    if value is None:
        raise ValueError(f"environment variable {name} is empty; it must be an integer.")
    return value


def _master(env: Mapping[str, str], default_addr: str = "127.0.0.1") -> tuple[str, int]:
    return env.get("MASTER_ADDR") or default_addr, _int(env, "MASTER_PORT", default=DEFAULT_MASTER_PORT)


def _from_torchrun(env: Mapping[str, str]) -> ProcessTopology | None:
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    world = _required(env, "WORLD_SIZE")
    local_world = _int(env, "LOCAL_WORLD_SIZE", default=world)
    addr, port = _master(env)
    return ProcessTopology(
        rank=_required(env, "RANK"),
        world_size=world,
        local_rank=_int(env, "LOCAL_RANK", default=0),
        local_world_size=local_world,
        node_rank=_int(env, "GROUP_RANK", "NODE_RANK", default=0),
        num_nodes=max(1, world // max(1, local_world)),
        master_addr=addr,
        master_port=port,
        launcher="torchrun",
    )


# (rank, size, local rank, local size) variable names per MPI implementation.
_MPI_FLAVOURS = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),
)


def _from_mpi(env: Mapping[str, str]) -> ProcessTopology | None:
    for rank_var, size_var, local_rank_var, local_size_var in _MPI_FLAVOURS:
        if rank_var in env and size_var in env:
            if local_rank_var not in env and "SLURM_PROCID" in env and "SLURM_STEP_NUM_TASKS" in env:
                # `srun --mpi=pmi2` sets PMI_RANK/PMI_SIZE but no local rank: SLURM's own variables have it
                return None
            world = _required(env, size_var)
            local_world = _int(env, local_size_var, default=world)
            rank = _required(env, rank_var)
            addr, port = _master(env)
            return ProcessTopology(
                rank=rank,
                world_size=world,
                local_rank=_int(env, local_rank_var, default=rank % local_world),
                local_world_size=local_world,
                node_rank=rank // max(1, local_world),
                num_nodes=max(1, world // max(1, local_world)),
                master_addr=addr,
                master_port=port,
                launcher="mpi",
            )
    return None


def _from_slurm(env: Mapping[str, str]) -> ProcessTopology | None:
    # Only an `srun` step describes the processes of this run; a batch script's
    # own environment has SLURM_NTASKS too but runs a single process.
    world = _int(env, "SLURM_STEP_NUM_TASKS")
    if world is None or "SLURM_PROCID" not in env:
        return None
    nodes = _int(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", default=1)
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    addr, port = _master(env, default_addr=first_slurm_host(nodelist) or "127.0.0.1")
    return ProcessTopology(
        rank=_required(env, "SLURM_PROCID"),
        world_size=world,
        local_rank=_int(env, "SLURM_LOCALID", default=0),
        local_world_size=max(1, world // max(1, nodes)),
        node_rank=_int(env, "SLURM_NODEID", default=0),
        num_nodes=nodes,
        master_addr=addr,
        master_port=port,
        launcher="slurm",
    )


def first_slurm_host(nodelist: str) -> str | None:
    """First host of a SLURM node list such as ``"gpu[03-05,09],cpu1"``.

    Example:
        >>> first_slurm_host("gpu[03-05,09],cpu1")
        'gpu03'
    """
    nodelist = nodelist.strip()
    if not nodelist:
        return None
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist)
    if match is None:
        return None
    prefix, ranges = match.groups()
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def select_device(
    local_rank: int,
    cpu: bool = False,
    cuda_available: bool | None = None,
    mps_available: bool | None = None,
):
    """The device this process computes on: ``cuda:LOCAL_RANK``, else MPS, else CPU.

    Hardware facts are parameters (read from torch when None) so the choice
    is testable without the hardware.

    Example:
        >>> select_device(1, cuda_available=True, mps_available=False)
        device(type='cuda', index=1)
    """
    import torch

    if cpu:
        return torch.device("cpu")
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if cuda_available:
        return torch.device("cuda", local_rank)
    if mps_available is None:
        mps_available = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    if mps_available:
        return torch.device("mps")
    return torch.device("cpu")


def backend_for_device(device_type: str) -> str:
    """The torch.distributed backend for a device type: nccl for CUDA, gloo otherwise.

    Example:
        >>> backend_for_device("cpu")
        'gloo'
    """
    return "nccl" if device_type == "cuda" else "gloo"
