"""`prepare_data_loader`: build this process's loader from the user's DataLoader, as Accelerate does.

What Accelerate 1.16's `prepare_data_loader` does to a loader, and so what a
script observes (the samples each process sees, the random numbers drawn and
when, the batch geometry), is reproduced here; hasten's additions (a seekable
order for exact resume, batches cut straight from the order) do not change
any of it:

- a stock `RandomSampler` / `SequentialSampler` (also inside a
  `BatchSampler` given as the sampler) becomes a `SampleOrder` that draws
  what the sampler would draw (see `order.py`): on one process, from the
  global RNG at each pass; on several, from a generator seeded once here from
  the global RNG and made equal on every process; with
  ``use_seedable_sampler=True``, from ``data_seed + epoch``;
- the batches are sharded by `ShardedBatchSampler` (Accelerate's
  `BatchSamplerShard` layout) or, for an iterable dataset,
  `IterableDatasetShard`; a `datasets.IterableDataset` with enough shards is
  split by its shards;
- ``dispatch_batches=None`` means: dispatch iterable datasets when batches
  are put on the device (Accelerate's default);
- a `torch_device_mesh` shards over its data-parallel dims only: processes
  of one tensor/context-parallel group read the same batches (see
  `mesh.py`, the rule `Accelerator.prepare` shards by as well).
"""

from __future__ import annotations

import functools
import logging
import warnings
from typing import Any, Callable, cast

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler
from torch.utils.data.distributed import DistributedSampler

from ..runtime.gradient_state import GradientState
from .loader import PreparedDataLoader, _takes_epoch, get_sampler, loader_kwargs
from .mesh import mesh_loader_share
from .order import PERMUTATION_LIMIT, SampleOrder
from .samplers import SeedableRandomSampler, SeedableSampleOrder
from .elastic import ElasticBatchSampler, ElasticSource
from .sharding import IterableDatasetShard, ShardedBatchSampler
from .skipping import SkipDataLoader

__all__ = ["prepare_data_loader"]

logger = logging.getLogger(__name__)
_warned_large = False


def _rank0_generator(generator: torch.Generator, num_processes: int) -> None:
    """Give `generator` rank 0's state on every process (one collective; works on gloo and nccl)."""
    if num_processes > 1:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            holder = [generator.get_state()]
            dist.broadcast_object_list(holder, src=0)
            generator.set_state(holder[0])


def _global_draw() -> int:
    """One int64 drawn from torch's global RNG, as torch's samplers draw their seeds."""
    return int(torch.empty((), dtype=torch.int64).random_().item())


def _large(num_items: int) -> bool:
    global _warned_large
    if num_items <= PERMUTATION_LIMIT:
        return False
    if not _warned_large:
        _warned_large = True
        logger.warning("a shuffled loader over %d samples uses hasten's keyed O(1)-memory order instead of a "
                       "permutation (> %d samples would need %.1f GiB); its order differs from Accelerate's.",
                       num_items, PERMUTATION_LIMIT, num_items * 8 / 2**30)
    return True


def _sample_order(loader: DataLoader, sampler: Any, sharded: bool, num_processes: int, seedable: bool,
                  data_seed: int | None, keyed: bool) -> SampleOrder | None:
    """The `SampleOrder` standing for a stock sampler, drawing what it would draw; None for other samplers."""
    if type(sampler) is SequentialSampler:
        return SampleOrder(len(sampler.data_source), kind="sequential")
    random = type(sampler) in (RandomSampler, SeedableRandomSampler) or (seedable and isinstance(sampler, RandomSampler))
    if not random:
        return None
    num_items = len(sampler.data_source)
    common = dict(num_items=num_items, replacement=sampler.replacement, num_samples=sampler._num_samples)
    if keyed or _large(num_items):  # hasten's opt-in order: a seed agreed by every process
        seed = data_seed if data_seed is not None else torch.random.initial_seed()
        return SampleOrder(kind="keyed", seed=int(seed), **common)
    if seedable or isinstance(sampler, SeedableRandomSampler):
        seed = data_seed if data_seed is not None else getattr(sampler, "initial_seed", torch.random.initial_seed())
        return SeedableSampleOrder(sampler.data_source, seed=int(seed), generator=sampler.generator,
                                   replacement=sampler.replacement, num_samples=sampler._num_samples)
    generator = sampler.generator
    if generator is None and sharded:
        # Accelerate gives the sampler a generator seeded from the global RNG (every process agrees on it).
        generator = torch.Generator()
        generator.manual_seed(_global_draw())
    if generator is None:
        return SampleOrder(kind="global", **common)
    if sharded:
        _rank0_generator(generator, num_processes)
    return SampleOrder(kind="torch", generator=generator, **common)


def _check_elastic(dataloader: DataLoader, split_batches: bool, even_batches: bool, dispatch: bool,
                   elastic: ElasticSource) -> None:
    """Refuse, in one sentence, a loader setting an elastic run cannot keep the global order of at every size."""
    if elastic.layout.even:  # every process takes as many batches a step: plain sharding holds the order
        return
    what = ("split_batches=True" if split_batches else "even_batches=False" if not even_batches else
            "an IterableDataset" if isinstance(dataloader.dataset, IterableDataset) else
            "dispatch_batches=True" if dispatch else None)
    if what is not None:
        raise ValueError(f"an elastic run deals each optimizer step's batches over the processes it has, which "
                         f"{what} does not allow at {elastic.layout.processes} of {elastic.layout.max_processes} "
                         "processes; use a map-style dataset with a per-process batch size (the defaults), or a "
                         "machine range whose every size divides the processes at MAX x the accumulation.")


def _check_split(dataloader: DataLoader, num_processes: int) -> None:
    """`split_batches` needs a known batch size that the processes divide (checked before anything is built)."""
    size = dataloader.batch_size if dataloader.batch_size is not None else getattr(dataloader.batch_sampler, "batch_size", None)
    if not isinstance(size, int):
        raise ValueError("split_batches=True needs a batch size: give the DataLoader a batch_size, or a batch_sampler "
                         "with a batch_size attribute.")
    if size > 1 and size % num_processes:
        raise ValueError(f"split_batches=True needs the DataLoader's batch_size ({size}) to be a multiple of the number "
                         f"of processes ({num_processes}); change the batch size or use split_batches=False.")


def _epoch_targets(dataloader: DataLoader, sampler: Any, order: SampleOrder | None, sharded: bool,
                   sampler_is_batches: bool) -> tuple[Any, ...]:
    """The user's objects a pass tells its epoch: those Accelerate's prepared loader tells (its set_epoch chain).

    The dataset hears it only when the sampler does not (on several
    processes), or always on one; a custom batch sampler only on one process.
    """
    targets: list[Any] = []

    def add(obj: Any) -> None:
        if _takes_epoch(obj) and all(obj is not known for known in targets):
            targets.append(obj)

    dataset = dataloader.dataset
    if sampler_is_batches:
        if not sharded and dataloader.batch_size is not None:
            add(dataloader.sampler)
        add(dataset)
    elif sharded:
        if (order is not None and order.kind == "seedable") or _takes_epoch(sampler):
            add(sampler)
        else:
            add(dataset)
    else:
        batches = dataloader.batch_sampler
        add(batches)
        add(sampler)
        inner = getattr(getattr(batches, "batch_sampler", None), "sampler", None)
        if _takes_epoch(inner):
            add(inner)
        else:
            add(dataset)
    return tuple(targets)


def prepare_data_loader(
    dataloader: DataLoader,
    device: torch.device | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: list[Any] | None = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Callable[..., Any] | None = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: Any = None,
    *,
    gradient_state: GradientState | None = None,
    keyed_shuffle: bool = False,
    elastic: ElasticSource | None = None,
) -> PreparedDataLoader:
    """Return a loader that yields only this process's share of `dataloader` (on `device` with `put_on_device`).

    The arguments are Accelerate's, with the same meaning and defaults
    (`num_processes` / `process_index` default to the running processes).
    `rng_types` (e.g. ``["torch"]``) are made equal on every process at the
    start of each pass. `dispatch_batches=True`: process 0 alone reads
    `dataloader` and sends every process its rows (see `dispatch.py`). hasten
    adds `keyed_shuffle=True`: shuffle with its O(1)-memory keyed order (not
    Accelerate's order). With `use_stateful_dataloader` the loader is also a
    torchdata `StatefulDataLoader` whose `state_dict` is torchdata's, as
    Accelerate's (hasten's checkpoints keep the exact position either way).
    `torch_device_mesh` (a named `DeviceMesh`) shards over its
    ``dp_replicate`` x ``dp_shard`` processes, giving the processes of one
    ``tp`` / ``cp`` group the same batches, as Accelerate's does (rules and
    the dispatcher's reading of the mesh: `hasten.data.mesh`).

    In an elastic run the Accelerator passes `elastic` (its `ElasticRun`): a
    training pass then deals each step's micro-batches over the group as
    `hasten.data.elastic` says (the run's global order at any size).

    Example:
        >>> dl = DataLoader(list(range(8)), batch_size=2)
        >>> [b.tolist() for b in prepare_data_loader(dl, num_processes=2, process_index=0)]
        [[0, 1], [4, 5]]
    """
    if isinstance(dataloader, PreparedDataLoader) and not isinstance(dataloader, SkipDataLoader):
        raise ValueError("this DataLoader is already prepared; pass the original DataLoader to prepare once.")
    if dispatch_batches is None:
        dispatch_batches = bool(put_on_device) and isinstance(dataloader.dataset, IterableDataset)
    if slice_fn_for_dispatch is not None and not dispatch_batches:
        raise ValueError("slice_fn_for_dispatch only applies with dispatch_batches=True; set both or drop it.")
    if dispatch_batches and not put_on_device:
        raise ValueError("dispatch_batches=True needs put_on_device=True (the batches are sent to each device).")
    if num_processes is None or process_index is None or torch_device_mesh is not None:
        from ..runtime.state import PartialState

        state = PartialState()
        num_processes = state.num_processes if num_processes is None else num_processes
        process_index = state.process_index if process_index is None else process_index
        if torch_device_mesh is not None and not dispatch_batches:  # (the dispatcher reads the mesh itself)
            from ..options.enums import DistributedType

            deepspeed = state.distributed_type == DistributedType.DEEPSPEED
            num_processes, process_index = mesh_loader_share(torch_device_mesh, num_processes, process_index, deepspeed)
    if split_batches:
        _check_split(dataloader, num_processes)
    if gradient_state is None:
        gradient_state = GradientState()
    if elastic is not None:
        _check_elastic(dataloader, split_batches, even_batches, dispatch_batches, elastic)
    build = functools.partial(_build, dataloader, device if put_on_device else None, split_batches=split_batches,
                              even_batches=even_batches, gradient_state=gradient_state, rng_types=rng_types,
                              seedable=use_seedable_sampler, data_seed=data_seed, non_blocking=non_blocking,
                              keyed=keyed_shuffle, stateful=use_stateful_dataloader, elastic=elastic)
    if dispatch_batches:  # process 0 reads the whole loader; the dispatcher splits each global batch
        from .dispatch import DispatchedDataLoader

        per_dispatch = 1 if split_batches else num_processes
        dispatcher = functools.partial(DispatchedDataLoader, num_processes=num_processes, process_index=process_index,
                                       batches_per_dispatch=per_dispatch, slice_fn=slice_fn_for_dispatch,
                                       split_batches=split_batches, torch_device_mesh=torch_device_mesh)
        loader = cast(DispatchedDataLoader, build(num_processes=1, process_index=0, make=dispatcher, dispatch=True))
        if loader.global_batch_size is not None:  # (one batch per step when every process gets the same one)
            loader.global_batch_size *= loader.batches_per_dispatch
        return loader
    return build(num_processes=num_processes, process_index=process_index, make=PreparedDataLoader, dispatch=False)


def _build(dataloader: DataLoader, device: torch.device | None, *, num_processes: int, process_index: int,
           split_batches: bool, even_batches: bool, gradient_state: GradientState, rng_types: list[Any] | None,
           seedable: bool, data_seed: int | None, non_blocking: bool, keyed: bool, stateful: bool,
           make: Callable[..., PreparedDataLoader], dispatch: bool,
           elastic: ElasticSource | None = None) -> PreparedDataLoader:
    """The prepared loader of `num_processes` ranks, made by `make` (PreparedDataLoader or the dispatcher)."""
    common: dict[str, Any] = dict(device=device, gradient_state=gradient_state, source_drop_last=dataloader.drop_last,
                                  non_blocking=non_blocking, use_stateful_dataloader=stateful,
                                  **loader_kwargs(dataloader))
    dataset = dataloader.dataset
    sharded = num_processes > 1 and not dispatch
    # an elastic run draws its order as its group at MAX does, whatever its size now
    sharded_order = sharded or (elastic is not None and elastic.layout.max_processes > 1)
    rng_types = [getattr(t, "value", t) for t in rng_types] if rng_types else []
    if isinstance(dataset, IterableDataset):
        return _build_iterable(dataloader, common, num_processes, process_index, split_batches, even_batches, sharded,
                               rng_types, make)

    sampler_is_batches = isinstance(dataloader.sampler, BatchSampler)
    batches: Any = dataloader.sampler if sampler_is_batches else dataloader.batch_sampler
    if batches is None:
        raise ValueError(
            "prepare needs a DataLoader with automatic batching; set batch_size (or batch_sampler) on it, "
            "or give it a BatchSampler as sampler."
        )
    sampler = get_sampler(dataloader)
    if isinstance(sampler, DistributedSampler):
        warnings.warn(
            "the DataLoader already uses a DistributedSampler, so hasten does not shard it again; "
            "drop the DistributedSampler to get hasten's sharding, even batches and gather_for_metrics.",
            stacklevel=4,
        )
        return make(dataset, batch_sampler=dataloader.batch_sampler, **common)
    order = None
    if type(batches) is BatchSampler:
        # Accelerate's seedable sampler never reaches a BatchSampler given as the sampler on several processes
        # (it is set on the shard, which does not read it): that loader keeps drawing as RandomSampler does.
        seedable_here = seedable and not (sampler_is_batches and sharded)
        order = _sample_order(dataloader, sampler, sharded_order and not (seedable and sampler_is_batches),
                              num_processes, seedable_here, data_seed, keyed)
    synchronized = None
    if order is not None:
        batches = BatchSampler(order, batches.batch_size, batches.drop_last)
    elif sharded_order and not seedable and getattr(sampler, "generator", False) is None:
        # A custom sampler with a `generator` attribute: Accelerate seeds one and keeps it equal on every process.
        sampler.generator = torch.Generator()
        sampler.generator.manual_seed(_global_draw())
    if order is None and sharded_order and not seedable and isinstance(getattr(sampler, "generator", None), torch.Generator):
        synchronized = sampler.generator
    if "generator" in rng_types:
        rng_types.remove("generator")  # the shuffle's generator is already equal on every process (or absent)
        if synchronized is not None:
            rng_types.append("generator")
    inner_batches = batches
    if elastic is not None and even_batches and not split_batches:  # (a group of one too: it pads as MAX does)
        batches = ElasticBatchSampler(batches, elastic)
    elif sharded:
        batches = ShardedBatchSampler(batches, num_processes, process_index, split_batches, even_batches)
    size = getattr(inner_batches, "batch_size", None)
    global_batch = None if size is None else (size if split_batches else size * num_processes)
    targets = _epoch_targets(dataloader, sampler, order, sharded, sampler_is_batches)
    extra = dict(order=order, global_batch_size=global_batch, rng_types=rng_types or None,
                 synchronized_generator=synchronized, epoch_targets=targets)
    if sampler_is_batches:
        return make(dataset, sampler=batches, batch_size=dataloader.batch_size, **extra, **common)
    return make(dataset, batch_sampler=batches, **extra, **common)


def _build_iterable(dataloader: DataLoader, common: dict[str, Any], num_processes: int, process_index: int,
                    split_batches: bool, even_batches: bool, sharded: bool, rng_types: list[Any],
                    make: Callable[..., PreparedDataLoader]) -> PreparedDataLoader:
    dataset: Any = dataloader.dataset  # an iterable dataset (a Hugging Face one can shard itself)
    if dataloader.batch_size is None and sharded:
        raise ValueError("prepare needs a DataLoader with a batch_size for an iterable dataset shared by several "
                         "processes; give the DataLoader a batch_size, or use dispatch_batches=True.")
    synchronized = None
    if sharded:
        hf_shards = _hf_iterable_shards(dataset)
        if hf_shards is not None and not split_batches and hf_shards >= num_processes:
            dataset = dataset.shard(num_shards=num_processes, index=process_index)  # each process its own shards
        else:
            if isinstance(getattr(dataset, "generator", None), torch.Generator):
                synchronized = dataset.generator
            if not even_batches:
                warnings.warn("even_batches=False does not apply to an iterable dataset (as in Accelerate): its last "
                              "batch is completed with the stream's first items.", stacklevel=5)
            dataset = IterableDatasetShard(dataset, batch_size=cast(int, dataloader.batch_size), drop_last=dataloader.drop_last,
                                           num_processes=num_processes, process_index=process_index,
                                           split_batches=split_batches)
    if "generator" in rng_types:
        rng_types.remove("generator")
        if synchronized is not None:
            rng_types.append("generator")
    size = dataloader.batch_size  # None only on one process (checked above)
    per_process = cast(int, size) // num_processes if split_batches and sharded else size
    targets = (dataset,) if _takes_epoch(dataset) else ()
    return make(dataset, batch_size=per_process, drop_last=dataloader.drop_last, rng_types=rng_types or None,
                synchronized_generator=synchronized,
                global_batch_size=None if per_process is None else per_process * num_processes,
                epoch_targets=targets, **common)


def _hf_iterable_shards(dataset: Any) -> int | None:
    """The shard count of a Hugging Face `datasets.IterableDataset` (None for other datasets); never imports datasets."""
    import sys

    module = sys.modules.get("datasets")
    kind = getattr(module, "IterableDataset", None) if module is not None else None
    if kind is not None and isinstance(dataset, kind):
        return int(dataset.n_shards)
    return None
