"""`dispatch_batches=True`: process 0 reads the data and sends each process its rows.

For data that only one process can read (a stream, a remote source, a
loader with side effects), process 0 iterates the original loader, joins
`num_processes` consecutive batches into one global batch (one batch with
`split_batches`), broadcasts it, and every process keeps its contiguous
slice of rows. A short last global batch is completed with the first rows
of the pass (as Accelerate's dispatcher does), and `gather_for_metrics`
drops the copies again.

Everything else is the prepared loader's: the seeded order, the look-ahead
that marks the last batch, the position saved by `save_state` (counted in
dispatched batches), `skip_first_batches`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.distributed
from torch.utils.data import IterableDataset
from torch.utils.data.dataloader import _DatasetKind

from ..runtime.collectives import _distributed, broadcast_object_list, recursively_apply
from .loader import PreparedDataLoader, _takes_epoch, _unique
from .mesh import dispatch_layout
from .sharding import seekable_order

__all__ = ["DispatchedDataLoader"]


@dataclass(frozen=True)
class _TensorSpec:
    """What a receiving process allocates for one tensor of the batch."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def _concatenate(batches: list[Any]) -> Any:
    """Join batches leaf by leaf (tensors along dim 0, lists end to end); other leaves come from the first."""
    first = batches[0]
    if len(batches) == 1:
        return first
    if isinstance(first, torch.Tensor):
        return torch.cat(batches)
    if isinstance(first, dict):
        return type(first)({key: _concatenate([b[key] for b in batches]) for key in first})
    if isinstance(first, (list, tuple)) and first and all(isinstance(b, (list, tuple)) for b in batches):
        if all(isinstance(item, (torch.Tensor, dict, list, tuple)) for item in first):  # a structure: join per field
            joined = [_concatenate([b[i] for b in batches]) for i in range(len(first))]
            return type(first)(*joined) if hasattr(first, "_fields") else type(first)(joined)
        return type(first)(item for b in batches for item in b)  # a column of plain values (e.g. strings)
    return first


def _rows(batch: Any) -> int:
    """The number of rows (samples) in a batch: the leading size of its first tensor, or its first list's length."""
    found: list[int] = []
    recursively_apply(lambda t: found.append(t.shape[0] if t.ndim else 1), batch)
    if found:
        return found[0]
    return len(batch) if isinstance(batch, (list, tuple)) else 1


def _take_rows(batch: Any, rows: list[int] | slice) -> Any:
    """The given rows of every tensor (and of every plain list) in the batch."""
    if isinstance(batch, torch.Tensor):
        return batch[rows] if batch.ndim else batch
    if isinstance(batch, dict):
        return type(batch)({key: _take_rows(value, rows) for key, value in batch.items()})
    if isinstance(batch, (list, tuple)):
        if batch and all(isinstance(item, (torch.Tensor, dict, list, tuple)) for item in batch):
            parts = [_take_rows(item, rows) for item in batch]
            return type(batch)(*parts) if hasattr(batch, "_fields") else type(batch)(parts)
        picked = batch[rows] if isinstance(rows, slice) else [batch[i] for i in rows]
        return type(batch)(picked)
    return batch


class DispatchedDataLoader(PreparedDataLoader):
    """A prepared loader whose batches are read on process 0 only and broadcast (`dispatch_batches=True`).

    Accelerate's `DataLoaderDispatcher` layout: process 0 joins
    `num_processes` batches (one with `split_batches`) into a global batch of
    R rows and every process keeps rows ``[r*R//N, (r+1)*R//N)``. Unless the
    loader drops its last batch, a last global batch whose rows do not divide
    by N is completed with the first N rows of the pass's first global batch
    (each process then keeps R//N + 1 rows). `len()` counts dispatched
    batches; at the last one, `remainder` is its number of real rows.

    Given a `torch_device_mesh` with a ``tp`` dim (and not `split_batches`),
    every process receives the same batch, as from Accelerate's dispatcher:
    process 0 reads one batch per step and each process keeps all of it (the
    global batch counts it once per process, as Accelerate's `remainder`
    does); see `hasten.data.mesh.dispatch_layout`.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> from hasten.data import prepare_data_loader
        >>> loader = prepare_data_loader(DataLoader(list(range(6)), batch_size=2), dispatch_batches=True, put_on_device=True)
        >>> [b.tolist() for b in loader]  # one process: it reads and keeps everything
        [[0, 1], [2, 3], [4, 5]]
    """

    def __init__(self, dataset: Any, *args: Any, num_processes: int | None = None, process_index: int | None = None,
                 batches_per_dispatch: int | None = None, slice_fn: Callable[..., Any] | None = None,
                 split_batches: bool = False, skip_batches: int = 0, use_stateful_dataloader: bool = False,
                 _drop_last: bool = False, _non_blocking: bool = False, torch_device_mesh: Any = None,
                 iteration: int = 0, same_batch_everywhere: bool | None = None, **kwargs: Any) -> None:
        # Accelerate's DataLoaderDispatcher parameters are named here, as in its signature; the base loader keeps them
        super().__init__(dataset, *args, skip_batches=skip_batches, use_stateful_dataloader=use_stateful_dataloader,
                         _drop_last=_drop_last, _non_blocking=_non_blocking, torch_device_mesh=torch_device_mesh,
                         iteration=iteration, **kwargs)
        if num_processes is None or process_index is None:  # built directly, as Accelerate's: the running processes
            from ..runtime.state import PartialState

            state = PartialState()
            num_processes = state.num_processes if num_processes is None else num_processes
            process_index = state.process_index if process_index is None else process_index
        if same_batch_everywhere is None:  # (a view is told what its loader decided)
            same_batch_everywhere = dispatch_layout(torch_device_mesh, split_batches)
        # tensor parallel: one batch per step, which every process keeps whole
        self.same_batch_everywhere = same_batch_everywhere
        if batches_per_dispatch is None or same_batch_everywhere:
            batches_per_dispatch = 1 if split_batches or same_batch_everywhere else num_processes
        self.num_processes = num_processes
        self.process_index = process_index
        self.batches_per_dispatch = batches_per_dispatch
        self.split_batches = batches_per_dispatch == 1 and num_processes > 1 and not same_batch_everywhere
        self.slice_fn = slice_fn
        self._last_rows: int | None = None
        self._first_rows: Any = None

    def default_epoch_targets(self) -> tuple[Any, ...]:
        """Accelerate's dispatcher chain: the batch sampler's sampler, else the dataset (each when it has `set_epoch`)."""
        sampler = getattr(self.batch_sampler, "sampler", None)
        return _unique([sampler if _takes_epoch(sampler) else self.dataset])

    def view_kwargs(self) -> dict[str, Any]:
        """What `skip_first_batches` passes on to a view of this loader."""
        return {"num_processes": self.num_processes, "process_index": self.process_index,
                "batches_per_dispatch": self.batches_per_dispatch, "slice_fn": self.slice_fn,
                "same_batch_everywhere": self.same_batch_everywhere}

    def __len__(self) -> int:
        inner = super(PreparedDataLoader, self).__len__()  # batches of the original loader
        if self.batches_per_dispatch == 1:
            whole = inner
        elif self._drop_last:
            whole = inner // self.batches_per_dispatch
        else:
            whole = -(-inner // self.batches_per_dispatch)
        return max(0, whole - self.skip_batches)

    @property
    def total_batch_size(self) -> int:
        return self.global_batch_size if self.global_batch_size is not None else super().total_batch_size

    def _start_remainder(self) -> int:
        return -1  # known at the last batch (`final_remainder`), as in Accelerate's dispatcher

    def final_remainder(self) -> int | None:
        return self._last_rows

    def _start_pass(self, skip: int) -> Iterator[Any]:
        # Every process starts the inner loader (torch draws its base seed there, as under Accelerate);
        # only the global rank 0 reads it (under tensor parallelism several ranks share a data index).
        # The global batches come unsliced: slicing waits for the loop's look-ahead to tell the last one.
        map_style = not isinstance(self.dataset, IterableDataset)
        inner = super()._start_pass(skip * self.batches_per_dispatch if map_style else 0)
        self._last_rows, self._first_rows = None, None
        distributed = _distributed()
        if distributed and torch.distributed.get_rank() != 0:
            return self._receive()
        items = self._global_batches(inner, skip, map_style)
        return self._send(items) if distributed else self._keep(items)

    def _global_batches(self, inner: Iterator[Any], skip: int, map_style: bool) -> Iterator[tuple[str, Any]]:
        """Process 0's global batches, each tagged "batch"; a pass that starts after `skip` of them first
        gives its first global batch tagged "first" (the last batch is completed from it)."""
        joined = self._join(inner)
        if skip and not map_style:  # a stream cannot seek: read the skipped global batches and drop them
            for index, batch in enumerate(itertools.islice(joined, skip)):
                if index == 0 and not self._drop_last:
                    yield "first", batch
        elif skip and not self._drop_last:
            first = self._first_global_batch()
            if first is not None:
                yield "first", first
        for batch in joined:
            yield "batch", batch

    def _first_global_batch(self) -> Any:
        """The pass's first global batch, fetched again (the pass seeked past it) without drawing anything.

        None for a custom batch sampler (its batches cannot be recomputed): the
        last batch is then completed from the first batch this pass reads.
        """
        order = seekable_order(self.batch_sampler)
        if order is None or self.batch_sampler.batch_size is None:  # type: ignore[union-attr]
            return None
        size = self.batch_sampler.batch_size  # type: ignore[union-attr]
        fetcher = _DatasetKind.create_fetcher(self._dataset_kind, self.dataset, self._auto_collation, self.collate_fn,
                                              self.drop_last)
        rng = torch.get_rng_state()  # a collate function may draw (masking): the pass must not see it
        try:
            batches = [fetcher.fetch(order.indices(k * size, (k + 1) * size)) for k in range(self.batches_per_dispatch)]
        finally:
            torch.set_rng_state(rng)
        return _concatenate([b for b in batches if _rows(b)])

    def _keep(self, items: Iterator[tuple[str, Any]]) -> Iterator[Any]:
        for kind, batch in items:
            if kind == "first":
                self._first_rows = _take_rows(batch, slice(0, self.num_processes))
            else:
                yield batch

    def _join(self, batches: Iterator[Any]) -> Iterator[Any]:
        group: list[Any] = []
        for batch in batches:
            group.append(batch)
            if len(group) == self.batches_per_dispatch:
                yield _concatenate(group)
                group = []
        if group and not self._drop_last:
            yield _concatenate(group)

    # -- process 0 --------------------------------------------------------------------------
    def _send(self, items: Iterator[tuple[str, Any]]) -> Iterator[Any]:
        import torch.distributed as dist

        device = self._wire_device()
        for kind, batch in items:
            tensors: list[torch.Tensor] = []

            def spec(tensor: torch.Tensor) -> _TensorSpec:
                tensors.append(tensor.detach().to(device).contiguous())
                return _TensorSpec(tuple(tensor.shape), tensor.dtype)

            header = recursively_apply(spec, batch)
            broadcast_object_list([(kind, header)], from_process=0)
            for tensor in tensors:
                dist.broadcast(tensor, src=0)
            sent = iter(tensors)
            batch = recursively_apply(lambda _: next(sent), header, test_type=_is_spec)
            if kind == "first":
                self._first_rows = _take_rows(batch, slice(0, self.num_processes))
            else:
                yield batch
        broadcast_object_list([None], from_process=0)  # the end of the pass, for everyone

    # -- every other process -------------------------------------------------------------------
    def _receive(self) -> Iterator[Any]:
        import torch.distributed as dist

        device = self._wire_device()
        while True:
            holder: list[Any] = [None]
            broadcast_object_list(holder, from_process=0)
            if holder[0] is None:
                return
            kind, header = holder[0]

            def receive(spec: _TensorSpec) -> torch.Tensor:
                tensor = torch.empty(spec.shape, dtype=spec.dtype, device=device)
                dist.broadcast(tensor, src=0)
                return tensor

            batch = recursively_apply(receive, header, test_type=_is_spec)
            if kind == "first":
                self._first_rows = _take_rows(batch, slice(0, self.num_processes))
            else:
                yield batch

    # -- slicing -------------------------------------------------------------------------------
    def _finish(self, batch: Any, last: bool) -> Any:
        return super()._finish(self._my_rows(batch, last), last)

    def _my_rows(self, batch: Any, last: bool) -> Any:
        """This process's contiguous share of a global batch (see the class doc for the short last one)."""
        count, index = self.num_processes, self.process_index
        if self.same_batch_everywhere:  # Accelerate's layout: the batch repeated once per process, then sliced
            batch = _concatenate([batch] * count)
        rows = _rows(batch)
        if not self._drop_last and self._first_rows is None:
            self._first_rows = _take_rows(batch, slice(0, count))
        per_process = rows // count
        if last:
            self._last_rows = rows
            if not self._drop_last and rows % count:
                batch = _concatenate([batch, self._first_rows])
                per_process += 1
        wanted = slice(index * per_process, (index + 1) * per_process)
        if self.slice_fn is not None:
            return self.slice_fn(batch, wanted, process_index=index, num_processes=count)
        return _take_rows(batch, wanted)

    def _wire_device(self) -> torch.device:
        """Where broadcast tensors live: the accelerator's device under NCCL, else the CPU."""
        import torch.distributed as dist

        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")


def _is_spec(value: Any) -> bool:
    return isinstance(value, _TensorSpec)
