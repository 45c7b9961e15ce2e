"""dispatch_batches=True, simulated in one process: which rows each rank keeps, padding, position, slice_fn."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from hasten.data import prepare_data_loader, skip_first_batches
from hasten.data.dispatch import DispatchedDataLoader


CPU = dict(device=torch.device("cpu"), put_on_device=True, dispatch_batches=True)


def _rows(num_processes: int, index: int, n: int = 7, batch_size: int = 2, **kwargs) -> list[list[int]]:
    loader = prepare_data_loader(DataLoader(list(range(n)), batch_size=batch_size), num_processes=num_processes,
                                 process_index=index, **CPU, **kwargs)
    assert isinstance(loader, DispatchedDataLoader)
    return [batch.tolist() for batch in loader]


def test_each_rank_keeps_its_contiguous_rows_of_the_global_batch():
    assert _rows(2, 0) == [[0, 1], [4, 5]]
    # the short last global batch [4, 5, 6] is completed with the pass's first rows (Accelerate's dispatcher)
    assert _rows(2, 1) == [[2, 3], [6, 0]]


def test_split_batches_dispatches_one_batch_split_in_two():
    assert _rows(2, 0, n=8, batch_size=4, split_batches=True) == [[0, 1], [4, 5]]
    assert _rows(2, 1, n=8, batch_size=4, split_batches=True) == [[2, 3], [6, 7]]


def test_the_dispatcher_pads_whatever_even_batches_says_as_accelerate_does():
    assert _rows(2, 1, even_batches=False) == _rows(2, 1) == [[2, 3], [6, 0]]


def test_dispatch_needs_batches_put_on_the_device():
    with pytest.raises(ValueError, match="put_on_device=True"):
        prepare_data_loader(DataLoader(list(range(4)), batch_size=2), dispatch_batches=True)


def test_padded_last_batch_reports_its_real_samples():
    from hasten.runtime.gradient_state import GradientState

    state = GradientState()
    loader = prepare_data_loader(DataLoader(list(range(7)), batch_size=2), num_processes=2, process_index=1,
                                 gradient_state=state, **CPU)
    seen = [(batch.tolist(), state.end_of_dataloader, state.remainder) for batch in loader]
    assert seen == [([2, 3], False, -1), ([6, 0], True, 3)]  # unknown until the last batch, as in Accelerate


def test_len_counts_dispatched_batches_and_skip_first_batches_skips_them():
    loader = prepare_data_loader(DataLoader(list(range(10)), batch_size=2), num_processes=2, process_index=0, **CPU)
    assert len(loader) == 3
    view = skip_first_batches(loader, 1)
    assert isinstance(view, DispatchedDataLoader) and len(view) == 2
    assert [b.tolist() for b in view] == [[4, 5], [8]]  # the last global batch [8, 9] is split too


def test_position_resumes_in_dispatched_batches():
    def make() -> DispatchedDataLoader:
        return prepare_data_loader(DataLoader(list(range(12)), batch_size=2, shuffle=True), num_processes=2,
                                   process_index=1, use_seedable_sampler=True, data_seed=5, **CPU)

    full = [b.tolist() for b in make()]
    first = make()
    iterator = iter(first)
    next(iterator)
    state = first.state_dict()
    assert state["yielded"] == 1 and state["global_batch_size"] == 4
    resumed = make()
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == full[1:]


def test_nested_batches_and_plain_columns_are_sliced_alike():
    samples = [{"x": torch.tensor([float(i)]), "name": f"s{i}"} for i in range(4)]
    loader = prepare_data_loader(DataLoader(samples, batch_size=2), num_processes=2, process_index=1, **CPU)
    (batch,) = list(loader)
    assert batch["x"].flatten().tolist() == [2.0, 3.0] and batch["name"] == ["s2", "s3"]


def test_slice_fn_for_dispatch_replaces_the_slicing():
    calls = []

    def every_other(batch, rows, process_index, num_processes):
        calls.append((rows, process_index, num_processes))
        return batch[process_index::num_processes]

    loader = prepare_data_loader(DataLoader(list(range(4)), batch_size=2), num_processes=2, process_index=0,
                                 slice_fn_for_dispatch=every_other, **CPU)
    assert [b.tolist() for b in loader] == [[0, 2]]
    assert calls == [(slice(0, 2), 0, 2)]


def test_iterable_dataset_is_read_whole_and_split():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(6))

    loader = prepare_data_loader(DataLoader(Stream(), batch_size=1), num_processes=3, process_index=2,
                                 device=torch.device("cpu"), put_on_device=True)  # iterable: dispatched by default
    assert isinstance(loader, DispatchedDataLoader)
    assert [b.tolist() for b in loader] == [[2], [5]]


def test_two_processes_rank_zero_reads_and_dispatches(tmp_path):
    from conftest import launch_ranks

    results = launch_ranks("mp_dispatch.py", tmp_path)
    zero, one = results[0], results[1]
    assert zero["len"] == one["len"] == 3  # 11 samples, global batches of 4
    # together the ranks saw every sample once, plus one padding copy in the short last global batch
    seen = sorted(v for r in (zero, one) for b in r["batches"] for v in b["x"])
    assert len(seen) == 12 and sorted(set(seen)) == [float(i) for i in range(11)]
    assert [len(b["x"]) for b in zero["batches"]] == [2, 2, 2] == [len(b["x"]) for b in one["batches"]]
    for rank in (zero, one):  # the strings travel with their rows
        assert all(b["name"] == [f"s{int(v)}" for v in b["x"]] for b in rank["batches"])
    assert sorted(zero["gathered"]) == [float(i) for i in range(11)] and zero["gathered"] == one["gathered"]
    assert zero["rest_after"] == zero["rest_before"] and one["rest_after"] == one["rest_before"]
    assert len(zero["rest_after"]) == 2
