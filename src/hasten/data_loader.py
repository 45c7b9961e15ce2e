"""Data loader helpers under the peer's path (``accelerate.data_loader``); the code lives in `hasten.data`.

`DataLoaderShard` is hasten's `PreparedDataLoader`, `BatchSamplerShard` its
`ShardedBatchSampler`; `prepare_data_loader` here takes the peer's
parameter names.

Example:
    >>> import torch
    >>> from torch.utils.data import DataLoader
    >>> from hasten.data_loader import prepare_data_loader
    >>> loader = prepare_data_loader(DataLoader(list(range(4)), batch_size=2), num_processes=2, process_index=1)
    >>> [batch.tolist() for batch in loader]
    [[2, 3]]
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils.data import DataLoader

from .data import IterableDatasetShard, PreparedDataLoader, ShardedBatchSampler, SkipBatchSampler, skip_first_batches
from .data import prepare_data_loader as _prepare
from .data.dispatch import DispatchedDataLoader
from .data.samplers import SeedableRandomSampler

__all__ = [
    "BatchSamplerShard",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "IterableDatasetShard",
    "SeedableRandomSampler",
    "SkipBatchSampler",
    "prepare_data_loader",
    "skip_first_batches",
]

DataLoaderShard = PreparedDataLoader
DataLoaderDispatcher = DispatchedDataLoader
BatchSamplerShard = ShardedBatchSampler


def prepare_data_loader(
    dataloader: DataLoader,
    device: torch.device | str | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: list[str] | None = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Callable[..., Any] | None = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: Any = None,
) -> PreparedDataLoader:
    """This process's share of `dataloader`, with the peer's parameters (outside an `Accelerator`).

    `num_processes` / `process_index` default to the running process group.
    `rng_types`, `use_seedable_sampler`, `non_blocking` and
    `use_stateful_dataloader` are accepted: hasten's shuffles are always
    seeded identically on every process, its loaders always have a
    `state_dict`, and batches are moved without blocking. `data_seed` fixes
    the shuffle. `dispatch_batches=True` reads on process 0 only and sends
    each process its rows. Device meshes are refused.

    Example:
        >>> loader = prepare_data_loader(DataLoader(list(range(6)), batch_size=2), num_processes=2, process_index=0)
        >>> len(loader)
        2
    """
    if torch_device_mesh is not None:
        raise NotImplementedError("prepare_data_loader(torch_device_mesh=...) is not supported by hasten; drop it "
                                  "(use Accelerator(parallelism_config=...) for device meshes).")
    if num_processes is None or process_index is None:
        import torch.distributed as dist

        running = dist.is_available() and dist.is_initialized()
        num_processes = num_processes if num_processes is not None else (dist.get_world_size() if running else 1)
        process_index = process_index if process_index is not None else (dist.get_rank() if running else 0)
    return _prepare(dataloader, device=torch.device(device) if device is not None else None,
                    num_processes=num_processes, process_index=process_index, split_batches=split_batches,
                    even_batches=even_batches, device_placement=put_on_device, data_seed=data_seed,
                    dispatch_batches=bool(dispatch_batches), slice_fn_for_dispatch=slice_fn_for_dispatch)
