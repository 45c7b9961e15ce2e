"""N-D parallelism sizes (data replicate x data shard x context x sequence x tensor) and the device mesh they describe.

Mirrors Accelerate's ``accelerate.parallelism_config.ParallelismConfig`` (itself
modelled on torchtitan's ``ParallelDims``): the sizes multiply to the
number of processes, and :meth:`ParallelismConfig.build_device_mesh` lays the
processes out as one named ``DeviceMesh`` with the dimensions ordered
``("dp_replicate", "dp_shard", "cp", "sp", "tp")`` -- tensor parallel innermost, so
its (chatty) collectives stay between neighbouring ranks, on one machine. The
processes of one tp/cp/sp group are neighbours and read the same batch:
data-parallel rank = ``rank // non_data_parallel_size`` (Accelerate's rule).

Example:
    >>> from hasten.strategies.parallel.mesh import ParallelismConfig
    >>> config = ParallelismConfig(dp_shard_size=2, tp_size=2)   # 4 processes: FSDP x TP
    >>> config.total_size, config.fsdp_enabled, config.tp_enabled
    (4, True, True)
    >>> config.mesh_dim_names
    ('dp_shard', 'tp')
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["ParallelismConfig", "TorchTensorParallelConfig", "MESH_ORDER"]

# outermost -> innermost (Accelerate's order); the innermost dims get the neighbouring ranks
MESH_ORDER = ("dp_replicate", "dp_shard", "cp", "sp", "tp")
_SIZES = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size")


@dataclass
class TorchTensorParallelConfig:
    """Accelerate's tensor-parallel handler (``ParallelismConfig(tp_handler=...)``); the default when ``tp_size > 1``.

    Args:
        enable_async_tp: asynchronous tensor parallel; not supported (as in Accelerate: a warning, then ignored).

    hasten also accepts a plan as the handler: a dict, or an object with a
    ``tp_plan`` attribute; this one has none, so the model's own plan is used.

    Example:
        >>> TorchTensorParallelConfig().enable_async_tp
        False
    """

    enable_async_tp: bool = False

    def __post_init__(self) -> None:
        if self.enable_async_tp:
            warnings.warn("Async tensor parallelism is currently not supported, ignoring this option.", stacklevel=2)


@dataclass
class ParallelismConfig:
    """How many processes each kind of parallelism spans; the product must equal the number of processes.

    Args (Accelerate's, in its order; a size left as None reads ``PARALLELISM_CONFIG_<NAME>``, else 1):
        dp_replicate_size: data-parallel replicas (DDP, or the replicate dim of HSDP); 1 disables it.
        dp_shard_size: processes a model is sharded over (FSDP2); 1 disables sharding.
        tp_size: tensor-parallel degree (``torch.distributed.tensor.parallel``); 1 disables it.
        cp_size: context-parallel degree: each sequence is split over this many processes inside
            `accelerator.maybe_context_parallel` (torch's ring attention on CUDA, gathered-KV attention on CPU).
        cp_backend: ``"torch"`` (the only one).
        sp_size: DeepSpeed's Ulysses sequence-parallel degree (needs a `DeepSpeedPlugin`); 1 disables it.
        sp_backend: ``"deepspeed"`` (the only one).
        tp_handler: a `TorchTensorParallelConfig` (the default when ``tp_size > 1``), or hasten's plan: a dict
            of module-name pattern -> "colwise" / "rowwise", or an object with a `tp_plan`; without a plan
            the model's own `tp_plan` is used.
        cp_handler: a `TorchContextParallelConfig` (its `cp_comm_strategy`); made by default when cp_size > 1.
        sp_handler: a `DeepSpeedSequenceParallelConfig` (made when None and sp_size > 1); see
            ``hasten.strategies.deepspeed.ulysses``.

    A configuration whose sizes are all 1, given to an Accelerator on N
    processes, becomes ``dp_replicate_size=N`` (plain DDP), as in Accelerate.

    ``dp_replicate_size > 1`` with ``dp_shard_size == 1`` is plain DDP; with
    ``dp_shard_size > 1`` it is HSDP. Context parallel composes with FSDP/HSDP,
    not with plain DDP (as in Accelerate 1.16, which allows tensor parallel
    beside plain replication).

    Example:
        >>> config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)   # HSDP on 4 processes
        >>> config.dp_dim_names, config.needs_sharded_engine
        (['dp_replicate', 'dp_shard'], True)
        >>> ParallelismConfig(tp_size=2).validate(num_processes=2)
        >>> # in every process, after the process group exists:
        >>> # mesh = ParallelismConfig(tp_size=2).build_device_mesh("cpu"); mesh["tp"].size()
    """

    dp_replicate_size: int = None  # type: ignore[assignment]  # None: from the environment, else 1 (as Accelerate)
    dp_shard_size: int = None  # type: ignore[assignment]
    tp_size: int = None  # type: ignore[assignment]
    cp_size: int = None  # type: ignore[assignment]
    cp_backend: str = None  # type: ignore[assignment]
    sp_size: int = None  # type: ignore[assignment]
    sp_backend: str = None  # type: ignore[assignment]
    tp_handler: Any = None
    cp_handler: Any = None
    # sp: Ulysses sequence parallelism runs inside DeepSpeed (strategies/deepspeed/ulysses.py), on no mesh of ours
    sp_handler: Any = None
    device_mesh: Any = field(default=None, init=False, repr=False, compare=False)
    # flattened views ("dp", "dp_shard_cp", "dp_cp"), kept because torch is deprecating `root_mesh["flat_name"]`
    flattened_meshes: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in _SIZES:
            value = getattr(self, name)
            if value is None:  # Accelerate's "not given": its launcher's variable, else 1
                value = int(os.environ.get(f"PARALLELISM_CONFIG_{name.upper()}", "1"))
                setattr(self, name, value)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ParallelismConfig.{name} must be a whole number >= 1, got {value!r}; "
                                 f"use 1 to switch that parallelism off.")
        for name, default in (("cp_backend", "torch"), ("sp_backend", "deepspeed")):
            if getattr(self, name) is None:
                setattr(self, name, os.environ.get(f"PARALLELISM_CONFIG_{name.upper()}", default))
            if getattr(self, name) != default:
                raise ValueError(f"ParallelismConfig.{name} must be {default!r}, got {getattr(self, name)!r}.")
        if self.tp_size > 1 and self.tp_handler is None:
            self.tp_handler = TorchTensorParallelConfig()
        if self.sp_size > 1 and self.sp_handler is None:
            from ..deepspeed.ulysses import DeepSpeedSequenceParallelConfig

            self.sp_handler = DeepSpeedSequenceParallelConfig()
        if self.cp_size > 1 and self.sp_size > 1:
            raise ValueError("context parallelism (cp_size > 1) and DeepSpeed sequence parallelism (sp_size > 1) split "
                             "the same sequences; pick one of them.")
        if self.cp_size > 1 and self.dp_replicate_size > 1 and self.dp_shard_size == 1:
            raise ValueError("context parallelism cannot be combined with plain data replication (dp_replicate_size > 1 "
                             "with dp_shard_size == 1); set dp_shard_size > 1 to compose it with FSDP/HSDP instead.")
        if self.cp_size > 1:
            from .context_config import TorchContextParallelConfig

            self.cp_handler = TorchContextParallelConfig() if self.cp_handler is None else self.cp_handler
            if not isinstance(self.cp_handler, TorchContextParallelConfig):
                raise ValueError(f"cp_handler must be a TorchContextParallelConfig, not {type(self.cp_handler).__name__}; "
                                 "pass TorchContextParallelConfig(cp_comm_strategy=...).")

    def to_json(self) -> dict[str, Any]:
        """The configuration as a dict of plain values (Accelerate 1.16's keys; handlers as dicts, no device mesh).

        Example:
            >>> ParallelismConfig(dp_shard_size=2).to_json()["_sizes"]
            {'dp_replicate': 1, 'dp_shard': 2, 'tp': 1, 'cp': 1, 'sp': 1}
        """
        import copy

        out: dict[str, Any] = {name: getattr(self, name) for name in (*_SIZES[:4], "cp_backend", "sp_size", "sp_backend")}
        for name in ("tp_handler", "cp_handler", "sp_handler"):
            handler = getattr(self, name)
            out[name] = copy.deepcopy(vars(handler)) if hasattr(handler, "__dict__") else copy.deepcopy(handler)
        out["_sizes"] = {"dp_replicate": self.dp_replicate_size, "dp_shard": self.dp_shard_size, "tp": self.tp_size,
                         "cp": self.cp_size, "sp": self.sp_size}
        return out

    # -- sizes ----------------------------------------------------------------
    @property
    def sizes(self) -> dict[str, int]:
        """Every dimension's size, in mesh order."""
        return {"dp_replicate": self.dp_replicate_size, "dp_shard": self.dp_shard_size,
                "cp": self.cp_size, "sp": self.sp_size, "tp": self.tp_size}

    @property
    def total_size(self) -> int:
        """The product of all sizes: the number of processes this configuration needs."""
        return math.prod(self.sizes.values())

    @property
    def data_parallel_size(self) -> int:
        """Processes that see different batches: ``dp_replicate_size * dp_shard_size``."""
        return self.dp_replicate_size * self.dp_shard_size

    @property
    def non_data_parallel_size(self) -> int:
        """Processes that see the same batch: ``tp_size * cp_size * sp_size``."""
        return self.tp_size * self.cp_size * self.sp_size

    @property
    def dp_replicate_enabled(self) -> bool:
        return self.dp_replicate_size > 1

    @property
    def dp_shard_enabled(self) -> bool:
        return self.dp_shard_size > 1

    @property
    def dp_enabled(self) -> bool:
        """True when batches differ between processes (replication or sharding)."""
        return self.data_parallel_size > 1

    @property
    def fsdp_enabled(self) -> bool:
        """True when the model is sharded over ``dp_shard`` (FSDP2, or HSDP with replication)."""
        return self.dp_shard_size > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp_size > 1

    @property
    def cp_enabled(self) -> bool:
        return self.cp_size > 1

    @property
    def sp_enabled(self) -> bool:
        """True when DeepSpeed's Ulysses cuts sequences over ``sp_size`` processes."""
        return self.sp_size > 1

    @property
    def needs_sharded_engine(self) -> bool:
        """True when only the FSDP2 strategy can run this layout (sharding, tensor or context parallel)."""
        return self.fsdp_enabled or self.tp_enabled or self.cp_enabled  # CP shards the model over dp_shard_cp

    # -- mesh names (Accelerate/torchtitan naming) -----------------------------
    @property
    def dp_dim_names(self) -> list[str]:
        """The enabled data-parallel dims, flattened into ``"dp"`` on the mesh."""
        return [name for name in ("dp_replicate", "dp_shard") if self.sizes[name] > 1]

    @property
    def non_dp_dim_names(self) -> list[str]:
        """The enabled dims whose processes see the same batch (Accelerate's order: tp, cp, sp)."""
        return [name for name in ("tp", "cp", "sp") if self.sizes[name] > 1]

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """The dims FSDP shards parameters over, flattened into ``"dp_shard_cp"``."""
        return [name for name in ("dp_shard", "cp") if self.sizes[name] > 1]

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """The dims a loss is averaged over, flattened into ``"dp_cp"``."""
        return [name for name in ("dp_replicate", "dp_shard", "cp") if self.sizes[name] > 1]

    @property
    def fsdp_dim_names(self) -> list[str]:
        """The mesh dims to pass to ``fully_shard``: ``["dp_replicate", "dp_shard_cp"]`` for HSDP, else ``["dp_shard_cp"]``."""
        return (["dp_replicate"] if self.dp_replicate_enabled else []) + ["dp_shard_cp"]

    @property
    def active_mesh_dims(self) -> list[str]:
        return [name for name in MESH_ORDER if self.sizes[name] > 1]

    @property
    def mesh_dim_names(self) -> tuple[str, ...]:
        """The names of the mesh's real dims; ``("dp_shard",)`` when every size is 1 (a mesh has at least one dim)."""
        return tuple(self.active_mesh_dims) or ("dp_shard",)

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return tuple(self.sizes[name] for name in self.mesh_dim_names)

    def _get_mesh(self) -> tuple[tuple[Any, ...], ...]:
        """Accelerate's ``(dim names, sizes)`` of the enabled dims in mesh order; ``()`` when every size is 1.

        Example:
            >>> ParallelismConfig(dp_shard_size=2, tp_size=2)._get_mesh()
            (('dp_shard', 'tp'), (2, 2))
        """
        return tuple(zip(*((name, self.sizes[name]) for name in self.active_mesh_dims)))

    # -- checks and mesh ----------------------------------------------------------
    def validate(self, num_processes: int) -> None:
        """Raise unless the sizes multiply to `num_processes`.

        Example:
            >>> ParallelismConfig(dp_shard_size=2).validate(2)
        """
        if self.total_size != num_processes:
            raise ValueError(
                f"ParallelismConfig needs {self.total_size} processes (dp_replicate {self.dp_replicate_size} x "
                f"dp_shard {self.dp_shard_size} x cp {self.cp_size} x sp {self.sp_size} x tp {self.tp_size}) but "
                f"{num_processes} were started; change the sizes so their product is {num_processes}, or launch "
                f"{self.total_size} processes.")

    def settle(self, num_processes: int, fsdp_plugin_given: bool = False) -> None:
        """What an Accelerator does with the configuration (Accelerate's `_validate_accelerator`).

        All sizes 1 on several processes becomes ``dp_replicate_size=num_processes``
        (plain DDP); then the sizes must multiply to `num_processes`, and an FSDP
        plugin needs a dim to shard over.

        Example:
            >>> config = ParallelismConfig()
            >>> config.settle(4)
            >>> config.dp_replicate_size
            4
        """
        if num_processes > 1 and self.total_size == 1:
            self.dp_replicate_size = num_processes
        if not self.sp_enabled:  # DeepSpeed makes its own sequence x data groups over every process (as Accelerate)
            self.validate(num_processes)
        if fsdp_plugin_given and num_processes > 1 and not (self.dp_shard_enabled or self.cp_enabled):
            raise ValueError("an FSDP plugin was given but the ParallelismConfig has no dim to shard over "
                             "(dp_shard_size and cp_size are 1); set dp_shard_size > 1, or drop the FSDP plugin.")

    def build_device_mesh(self, device_type: str) -> DeviceMesh:
        """Build (once) and return the named device mesh over all processes of the default process group.

        Dims of size 1 are left out; ``"dp"``, ``"dp_shard_cp"`` and
        ``"dp_cp"`` are flattened views over the dims named by
        :attr:`dp_dim_names`, :attr:`dp_shard_cp_dim_names` and
        :attr:`dp_cp_dim_names` (when any is enabled), so ``mesh["dp"]`` is
        the group batches differ over and ``mesh["tp"]`` the tensor-parallel group.

        Example:
            >>> import hasten
            >>> def build():  # in each of 4 processes
            ...     hasten.PartialState(cpu=True)  # creates the process group
            ...     config = ParallelismConfig(dp_shard_size=2, tp_size=2)
            ...     mesh = config.build_device_mesh("cpu")
            ...     assert mesh.mesh_dim_names == ("dp_shard", "tp") and config.submesh("dp").size() == 2
            >>> hasten.debug_launcher(build, num_processes=4)
        """
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        if self.device_mesh is not None:
            if self.device_mesh.device_type != device_type:
                raise ValueError(f"the device mesh was already built for {self.device_mesh.device_type!r}, not "
                                 f"{device_type!r}; use one device type per ParallelismConfig.")
            return self.device_mesh
        grouped = dist.is_available() and dist.is_initialized()
        if grouped:
            self.validate(dist.get_world_size())
        try:  # without a group, torch's init_device_mesh makes one from torchrun's variables (as under Accelerate)
            mesh = init_device_mesh(device_type, self.mesh_shape, mesh_dim_names=self.mesh_dim_names)
        except (ValueError, RuntimeError) as error:
            if grouped:
                raise
            raise RuntimeError("build_device_mesh needs the process group, and torch could not create one from the "
                               "environment; create hasten.PartialState() or hasten.Accelerator() first.") from error
        for flat_name, dims in (("dp", self.dp_dim_names), ("dp_shard_cp", self.dp_shard_cp_dim_names),
                                ("dp_cp", self.dp_cp_dim_names)):
            if dims:  # a single dim flattens to an alias of itself, so mesh["dp"] always works once dp is on
                # the names go as a list, as Accelerate slices them (libraries patching the mesh see the same call)
                self.flattened_meshes[flat_name] = mesh[dims]._flatten(flat_name)  # type: ignore[index]
        self.device_mesh = mesh
        return mesh

    def submesh(self, name: str) -> DeviceMesh:
        """The 1-D mesh of one dim or flattened view (``"tp"``, ``"dp"``, ``"dp_shard_cp"``...) of the built mesh.

        Prefer it to ``mesh["dp"]``: torch is deprecating slicing flattened dims from the root mesh.

        Example:
            >>> import hasten
            >>> def meshes():  # in each of 2 processes
            ...     hasten.PartialState(cpu=True)
            ...     config = ParallelismConfig(tp_size=2)
            ...     config.build_device_mesh("cpu")
            ...     tp_mesh = config.submesh("tp")
            ...     assert tp_mesh.size() == 2 and tp_mesh.mesh_dim_names == ("tp",)
            >>> hasten.debug_launcher(meshes, num_processes=2)
        """
        mesh = self.get_device_mesh()
        if name in self.flattened_meshes:
            return self.flattened_meshes[name]
        if name not in (mesh.mesh_dim_names or ()):
            raise KeyError(f"the device mesh has no dim {name!r} (it has {mesh.mesh_dim_names} and flattened views "
                           f"{sorted(self.flattened_meshes)}); a dim of size 1 is left out of the mesh.")
        return mesh[name]

    def get_device_mesh(self, device_type: str | None = None) -> DeviceMesh:
        """The mesh built by :meth:`build_device_mesh` (built now when `device_type` is given).

        Example:
            >>> import hasten
            >>> def mesh():  # in each of 2 processes
            ...     hasten.PartialState(cpu=True)
            ...     config = ParallelismConfig(dp_shard_size=2)
            ...     built = config.get_device_mesh("cpu")  # builds it
            ...     assert config.get_device_mesh() is built and built.mesh_dim_names == ("dp_shard",)
            >>> hasten.debug_launcher(mesh, num_processes=2)
        """
        if self.device_mesh is None:
            if device_type is None:
                raise ValueError("the device mesh is not built yet; pass device_type, e.g. get_device_mesh('cpu').")
            return self.build_device_mesh(device_type)
        if device_type is not None and device_type != self.device_mesh.device_type:
            raise ValueError(f"the device mesh was already built for {self.device_mesh.device_type!r}, not "
                             f"{device_type!r}; use one device type per ParallelismConfig.")
        return self.device_mesh

