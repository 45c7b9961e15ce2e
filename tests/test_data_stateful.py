"""Loaders as Accelerate's `data_loader` makes them: torchdata-backed under use_stateful_dataloader, skip views, cleanup."""

from __future__ import annotations

import gc
import pickle
import weakref

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, DataLoaderConfiguration
from hasten.data import PreparedDataLoader, SkipDataLoader, prepare_data_loader, skip_first_batches
from hasten.data.dispatch import DispatchedDataLoader

stateful_dataloader = pytest.importorskip("torchdata.stateful_dataloader")
StatefulDataLoader = stateful_dataloader.StatefulDataLoader


def _first(loader, n):
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == n:
            break
    return batches


@pytest.mark.parametrize("kind", [PreparedDataLoader, DispatchedDataLoader, SkipDataLoader])
def test_a_stateful_loader_is_torchdatas_and_its_state_is_the_batches_handed_out(kind):
    reference = StatefulDataLoader(list(range(32)), batch_size=4)
    loader = kind(list(range(32)), batch_size=4, use_stateful_dataloader=True)
    assert isinstance(loader, StatefulDataLoader) and isinstance(loader, kind) and loader.base_dataloader is loader
    expected = _first(reference, 3)
    assert [b.tolist() for b in _first(loader, 3)] == [b.tolist() for b in expected]
    # the look-ahead batch is read but not handed out: the state counts 3, as Accelerate's and torchdata's
    assert loader.state_dict() == reference.state_dict()
    resumed = kind(list(range(32)), batch_size=4, use_stateful_dataloader=True)
    resumed.load_state_dict(reference.state_dict())
    assert [b.tolist() for b in resumed] == [list(range(i, i + 4)) for i in range(12, 32, 4)]


def test_a_stateful_loader_pickles_and_a_plain_one_is_no_torchdata_loader():
    loader = prepare_data_loader(DataLoader(list(range(8)), batch_size=2), use_stateful_dataloader=True)
    copy = pickle.loads(pickle.dumps(loader))
    assert type(copy) is type(loader) and [b.tolist() for b in copy] == [b.tolist() for b in loader]
    plain = prepare_data_loader(DataLoader(list(range(8)), batch_size=2))
    assert not isinstance(plain, StatefulDataLoader) and plain.state_dict()["yielded"] == 0


def test_skip_first_batches_of_a_torch_loader_is_a_torch_loader_that_prepare_registers():
    skipped = skip_first_batches(DataLoader(list(range(10)), batch_size=2), 2)
    assert type(skipped) is DataLoader and [b.tolist() for b in skipped] == [[4, 5], [6, 7], [8, 9]]
    stream = skip_first_batches(DataLoader(_Stream(), batch_size=2), 1)
    assert isinstance(stream, SkipDataLoader) and [b.tolist() for b in stream] == [[2, 3]]
    accelerator = Accelerator(cpu=True)
    prepared = accelerator.prepare(skipped)
    assert prepared in accelerator._dataloaders and [b.tolist() for b in prepared] == [[4, 5], [6, 7], [8, 9]]


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(4))


def test_set_epoch_reaches_the_samplers_at_once():
    class Sampler(torch.utils.data.SequentialSampler):
        epoch = 0

        def set_epoch(self, epoch):
            self.epoch = epoch

    sampler = Sampler(range(8))
    loader = PreparedDataLoader(list(range(8)), batch_size=2, sampler=sampler)
    loader.set_epoch(3)
    assert sampler.epoch == 3 and skip_first_batches(loader, 1).iteration == 3


def _run(tmp_path, stateful):
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=stateful))
    model = nn.Linear(3, 1)
    loader = DataLoader(TensorDataset(torch.arange(24.0).view(8, 3)), batch_size=2)
    return accelerator, *accelerator.prepare(model, loader)


def test_save_state_writes_accelerates_loader_state_and_reads_it_from_accelerates_folders(tmp_path):
    accelerator, model, loader = _run(tmp_path, stateful=True)
    _first(loader, 2)
    saved = accelerator.save_state(tmp_path / "ckpt")
    assert torch.load(tmp_path / "ckpt" / "dl_state_dict.bin", weights_only=True) == loader.state_dict()
    accelerator.load_state(saved)  # hasten's own folder: the exact position from its manifest
    assert [b[0][:, 0].tolist() for b in loader] == [[12.0, 15.0], [18.0, 21.0]]
    # Accelerate's files alone (no manifest): the torchdata state is what resumes, as under Accelerate
    from hasten.checkpointing import save_accelerator_state

    accelerator, model, loader = _run(tmp_path, stateful=True)
    _first(loader, 3)
    folder = tmp_path / "accelerate"
    folder.mkdir()
    save_accelerator_state(folder, [model.state_dict()], [], [], [loader], 0, step=0)
    accelerator, model, loader = _run(tmp_path, stateful=True)
    accelerator.load_state(folder)
    assert [b[0][:, 0].tolist() for b in loader] == [[18.0, 21.0]]


def test_a_deleted_accelerator_and_its_iterated_loader_are_freed_without_the_collector():
    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(DataLoader(list(range(8)), batch_size=2))
    batches = iter(loader)
    next(batches)
    refs = [weakref.ref(accelerator), weakref.ref(loader)]
    gc.disable()
    try:
        del accelerator, loader, batches
        assert [ref() for ref in refs] == [None, None]
    finally:
        gc.enable()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_stateful_loader_draws_when_built_and_its_first_pass_draws_nothing_more_as_accelerates(num_workers):
    # Accelerate's stateful loader takes torchdata's state when built: the first pass's iterator is made (and its
    # base seed drawn) at prepare, with workers also their first indices (the shuffle's seed drawn), so what the
    # script draws next is shifted by those draws.
    def run(stateful):
        torch.manual_seed(0)
        loader = prepare_data_loader(DataLoader(list(range(8)), batch_size=2, shuffle=True, num_workers=num_workers),
                                     use_stateful_dataloader=stateful)
        after_prepare = torch.rand(1)
        return after_prepare, [b.tolist() for b in loader], torch.rand(1)

    torch.manual_seed(0)
    for _ in range(1 if num_workers == 0 else 2):
        torch.empty((), dtype=torch.int64).random_()
    shifted = torch.rand(1)
    stateful, plain = run(True), run(False)
    assert torch.equal(stateful[0], shifted) and not torch.equal(plain[0], shifted)
    assert torch.equal(stateful[2], plain[2])  # the same number of draws in all
