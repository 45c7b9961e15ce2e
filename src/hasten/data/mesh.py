"""Which batches a process of an N-D parallel layout reads: the data-parallel share of a device mesh.

Processes that split one model's tensors (tensor parallel) or one sequence
(context parallel) must read the same batch; processes that hold different
replicas or shards of the model (``dp_replicate``, ``dp_shard``) read
different ones. `data_parallel_share` is that rule over dimension sizes, used
by the FSDP2 strategy for `Accelerator.prepare` and by
``prepare_data_loader(torch_device_mesh=...)``, which reads the sizes off a
`DeviceMesh` by its dimension names, as Accelerate's does:

- data-parallel groups = ``dp_replicate * dp_shard`` (a dim the mesh lacks
  counts 1; other names, such as ``"dp"``, are not read: as in Accelerate, the
  processes along them read the same batches, and hasten says so);
- this process's group = ``rank // (tp * cp)``;
- under DeepSpeed (Accelerate's other branch), only ``tp`` is read:
  ``num_processes // tp`` groups, group ``rank // tp``.

With ``dispatch_batches=True`` Accelerate's dispatcher reads the mesh
differently (see `dispatch_layout`): with a ``tp`` dim, every process gets
the same batch.

Example:
    >>> data_parallel_share({"dp_shard": 2, "tp": 2}, process_index=3)
    (2, 1)
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Iterable, Mapping

__all__ = ["DATA_PARALLEL_DIMS", "SAME_BATCH_DIMS", "data_parallel_share", "dispatch_layout", "mesh_dim_sizes",
           "mesh_loader_share"]

DATA_PARALLEL_DIMS = ("dp_replicate", "dp_shard")  # processes along these read different batches
SAME_BATCH_DIMS = ("tp", "cp")  # processes along these read the same batch (Accelerate's prepare_data_loader rule)


def data_parallel_share(sizes: Mapping[str, int], process_index: int,
                        same_batch: Iterable[str] = SAME_BATCH_DIMS) -> tuple[int, int]:
    """(number of data-parallel groups, this process's group) for a layout given as dimension name -> size.

    The dims in `same_batch` are innermost (neighbouring ranks), so a group
    is ``process_index // prod(same_batch sizes)``; the number of groups is
    the product of the ``dp_replicate`` and ``dp_shard`` sizes. A name the
    layout lacks counts 1.

    Example:
        >>> data_parallel_share({"dp_replicate": 2, "cp": 2}, process_index=2)
        (2, 1)
        >>> data_parallel_share({"tp": 4}, process_index=3)
        (1, 0)
    """
    groups = math.prod(int(sizes.get(name, 1)) for name in DATA_PARALLEL_DIMS)
    together = math.prod(int(sizes.get(name, 1)) for name in same_batch)
    return groups, process_index // together


def mesh_dim_sizes(mesh: Any) -> dict[str, int]:
    """The sizes of a `DeviceMesh`'s named dimensions (flattened views are not dimensions of the mesh itself).

    Example:
        >>> class Mesh:  # a stand-in with DeviceMesh's two attributes
        ...     mesh_dim_names = ("dp_shard", "tp")
        ...     def size(self, dim): return (2, 4)[dim]
        >>> mesh_dim_sizes(Mesh())
        {'dp_shard': 2, 'tp': 4}
    """
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    if not names:
        raise ValueError("prepare_data_loader(torch_device_mesh=...) needs a DeviceMesh with named dimensions; build "
                         "it with init_device_mesh(..., mesh_dim_names=(...)), e.g. ('dp_shard', 'tp').")
    return {name: int(mesh.size(index)) for index, name in enumerate(names)}


def mesh_loader_share(mesh: Any, num_processes: int, process_index: int, deepspeed: bool = False) -> tuple[int, int]:
    """(num_processes, process_index) a loader shards over on `mesh`, as Accelerate's `prepare_data_loader` derives them.

    A mesh whose dims put some processes in a group past the last one (a dim
    such as ``"sp"`` beside ``dp_shard``, which Accelerate neither shards over
    nor keeps together) is refused in one sentence, on every process alike;
    Accelerate fails there inside its batch sampler, on those processes.

    Example:
        >>> class Mesh:
        ...     mesh_dim_names = ("dp_replicate", "cp")
        ...     def size(self, dim): return 2
        >>> mesh_loader_share(Mesh(), num_processes=4, process_index=3)
        (2, 1)
        >>> mesh_loader_share(Mesh(), num_processes=4, process_index=3, deepspeed=True)
        (4, 3)
    """
    sizes = mesh_dim_sizes(mesh)
    if deepspeed:  # Accelerate's DeepSpeed branch reads tp alone
        tp = sizes.get("tp", 1)
        return num_processes // tp, process_index // tp
    groups, group = data_parallel_share(sizes, process_index)
    unread = [name for name, size in sizes.items() if name not in DATA_PARALLEL_DIMS + SAME_BATCH_DIMS and size > 1]
    last_group = data_parallel_share(sizes, math.prod(sizes.values()) - 1)[1]  # the same on every process
    if groups > 1 and last_group >= groups:
        raise ValueError(
            f"prepare_data_loader: the device mesh {sizes} has {groups} data-parallel groups but puts processes in "
            f"groups up to {last_group}, because its dims {unread} are neither data parallel (dp_replicate, dp_shard) "
            f"nor read together (tp, cp); rename them to one of those, or shard by num_processes / process_index.")
    if unread:
        warnings.warn(
            f"prepare_data_loader: the device mesh's dims {unread} are not among those Accelerate's rule reads "
            f"(dp_replicate, dp_shard shard the data; tp, cp read it together), so, as in Accelerate, the processes "
            f"along them read the same batches; name a data-parallel dim dp_shard or dp_replicate to shard over it.",
            stacklevel=3)
    return groups, group


def dispatch_layout(mesh: Any, split_batches: bool) -> bool:
    """Whether a dispatching loader gives every process the same batch on `mesh` (Accelerate's dispatcher rule).

    With a ``tp`` dim, process 0 reads one batch per step and every process
    receives all of it (with `split_batches`, the batch is cut over every
    process as without a mesh, and hasten warns as Accelerate does); a mesh
    with ``tp`` and a ``dp`` or ``fsdp`` dim is refused, as in Accelerate.
    Without ``tp`` the mesh changes nothing.

    Example:
        >>> class Mesh:
        ...     mesh_dim_names = ("tp",)
        ...     def size(self, dim): return 4
        >>> dispatch_layout(Mesh(), split_batches=False), dispatch_layout(None, split_batches=False)
        (True, False)
    """
    if mesh is None:
        return False
    sizes = mesh_dim_sizes(mesh)
    if "tp" not in sizes:
        return False
    if "dp" in sizes or "fsdp" in sizes:
        raise ValueError("dispatch_batches=True with a device mesh holding 'tp' beside a 'dp' or 'fsdp' dim is not "
                         "supported (as in Accelerate); use dispatch_batches=False, or a mesh without those dims.")
    if split_batches:
        warnings.warn("dispatch_batches=True with split_batches=True on a mesh with 'tp': each batch is cut over every "
                      "process, tensor-parallel ranks included, as in Accelerate; use split_batches=False to give "
                      "every process the same batch.", stacklevel=3)
        return False
    if any(sizes.get(name, 1) > 1 for name in DATA_PARALLEL_DIMS):
        warnings.warn(f"dispatch_batches=True on the device mesh {sizes}: every process receives the same batches, "
                      f"also across dp_replicate / dp_shard (Accelerate's dispatcher reads only 'tp'); use "
                      f"dispatch_batches=False to shard over the data-parallel dims.", stacklevel=3)
    return True
