"""`dispatch_batches=True`: process 0 reads the data and sends each process its rows.

For data that only one process can read (a stream, a remote source, a
loader with side effects), process 0 iterates the original loader, joins
`num_processes` consecutive batches into one global batch (one batch with
`split_batches`), broadcasts it, and every process keeps its contiguous
slice of rows. With `even_batches` a short last global batch is padded by
cycling its rows, and `gather_for_metrics` drops the copies again.

Everything else is the prepared loader's: the seeded order, the look-ahead
that marks the last batch, the position saved by `save_state` (counted in
dispatched batches), `skip_first_batches`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.distributed

from ..collectives import _distributed, broadcast_object_list, recursively_apply, share_bounds
from .loader import PreparedDataLoader

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

    `len()` counts dispatched batches (one per step on every process).

    Example:
        >>> from torch.utils.data import DataLoader
        >>> from hasten.data import prepare_data_loader
        >>> loader = prepare_data_loader(DataLoader(list(range(6)), batch_size=2), dispatch_batches=True)
        >>> [b.tolist() for b in loader]  # one process: it reads and keeps everything
        [[0, 1], [2, 3], [4, 5]]
    """

    def __init__(self, *args: Any, num_processes: int = 1, process_index: int = 0, batches_per_dispatch: int = 1,
                 even_batches: bool = True, slice_fn: Callable[..., Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.num_processes = num_processes
        self.process_index = process_index
        self.batches_per_dispatch = batches_per_dispatch
        self.even_batches = even_batches
        self.slice_fn = slice_fn
        self._last_remainder = 0

    def view_kwargs(self) -> dict[str, Any]:
        """What `skip_first_batches` passes on to a view of this loader."""
        return {"num_processes": self.num_processes, "process_index": self.process_index,
                "batches_per_dispatch": self.batches_per_dispatch, "even_batches": self.even_batches,
                "slice_fn": self.slice_fn}

    def __len__(self) -> int:
        inner = super(PreparedDataLoader, self).__len__()  # batches of the original loader
        return max(0, -(-inner // self.batches_per_dispatch) - self.skip_batches)

    def final_remainder(self) -> int:
        return self._last_remainder

    def _start_pass(self, skip: int) -> Iterator[Any]:
        # The global rank 0 reads (under tensor parallelism several ranks share a data-parallel index).
        distributed = _distributed()
        if distributed and torch.distributed.get_rank() != 0:
            return self._receive()
        global_batches = self._join(super()._start_pass(skip * self.batches_per_dispatch))
        if distributed:
            return self._send(global_batches)
        return (self._my_rows(batch) for batch in global_batches)  # one process (or a simulated rank)

    def _join(self, batches: Iterator[Any]) -> Iterator[Any]:
        group: list[Any] = []
        for batch in batches:
            group.append(batch)
            if len(group) == self.batches_per_dispatch:
                yield _concatenate(group)
                group = []
        if group:
            yield _concatenate(group)

    # -- process 0 --------------------------------------------------------------------------
    def _send(self, global_batches: Iterator[Any]) -> Iterator[Any]:
        import torch.distributed as dist

        device = self._wire_device()
        for batch in global_batches:
            tensors: list[torch.Tensor] = []

            def spec(tensor: torch.Tensor) -> _TensorSpec:
                tensors.append(tensor.detach().to(device).contiguous())
                return _TensorSpec(tuple(tensor.shape), tensor.dtype)

            header = recursively_apply(spec, batch)
            broadcast_object_list([header], from_process=0)
            for tensor in tensors:
                dist.broadcast(tensor, src=0)
            sent = iter(tensors)
            yield self._my_rows(recursively_apply(lambda _: next(sent), header, test_type=_is_spec))
        broadcast_object_list([None], from_process=0)  # the end of the pass, for everyone

    # -- every other process -------------------------------------------------------------------
    def _receive(self) -> Iterator[Any]:
        import torch.distributed as dist

        device = self._wire_device()
        while True:
            holder: list[Any] = [None]
            broadcast_object_list(holder, from_process=0)
            header = holder[0]
            if header is None:
                return

            def receive(spec: _TensorSpec) -> torch.Tensor:
                tensor = torch.empty(spec.shape, dtype=spec.dtype, device=device)
                dist.broadcast(tensor, src=0)
                return tensor

            yield self._my_rows(recursively_apply(receive, header, test_type=_is_spec))

    # -- slicing -------------------------------------------------------------------------------
    def _my_rows(self, batch: Any) -> Any:
        """This process's contiguous share of a global batch (padded by cycling when it is short)."""
        count, index = self.num_processes, self.process_index
        rows = _rows(batch)
        self._last_remainder = 0
        if self.even_batches and rows % count:
            self._last_remainder = rows  # real samples in this padded batch: gather_for_metrics drops the rest
            per_process = -(-rows // count)
            batch = _take_rows(batch, [i % rows for i in range(per_process * count)])
            wanted = slice(index * per_process, (index + 1) * per_process)
        else:
            wanted = slice(*share_bounds(rows, index, count))
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
