"""Wrong behaviours found by running real scripts written for the peer, each pinned by a test."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from hasten import Accelerator
from hasten.runtime.collectives import split_for_process
from hasten.data import prepare_data_loader


def test_split_between_processes_gives_a_dataset_its_rows():
    import datasets

    table = datasets.Dataset.from_dict({"text": list("abcde"), "label": [0, 1, 0, 1, 0]})
    shares = [split_for_process(table, rank, 2) for rank in (0, 1)]
    assert all(isinstance(share, datasets.Dataset) for share in shares)  # not a dict of columns
    assert [list(share["text"]) for share in shares] == [["a", "b", "c"], ["d", "e"]]
    padded = split_for_process(table, 1, 2, apply_padding=True)
    assert list(padded["text"]) == ["d", "e", "e"] and list(padded["label"]) == [1, 0, 0]


def test_script_arguments_are_never_abbreviations_of_launcher_options(tmp_path):
    script = tmp_path / "args.py"
    script.write_text("import sys\nprint('ARGS', sys.argv[1:])\n")
    own = ["--start", "1", "--log", "x", "--nproc", "2", "--max", "3", "--num_processes", "7"]
    result = subprocess.run([sys.executable, "-m", "hasten", "launch", "--num_processes", "1", "--dry_run", str(script), *own],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert " ".join(own) in result.stdout, result.stdout
    # an abbreviated launcher option before the script is refused, not guessed
    result = subprocess.run([sys.executable, "-m", "hasten", "launch", "--num_proc", "2", str(script)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--num_proc" in result.stderr


class _Indexed(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, index):  # a list of indices: the whole batch at once
        return torch.tensor(index)


def test_a_batch_sampler_given_as_sampler_is_sharded_by_batches():
    dataset = _Indexed()
    loader = DataLoader(dataset, sampler=BatchSampler(SequentialSampler(dataset), batch_size=4, drop_last=False),
                        batch_size=None)
    accelerator = Accelerator(cpu=True)
    prepared = accelerator.prepare(loader)
    assert [b.tolist() for b in prepared] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    shards = [[b.tolist() for b in prepare_data_loader(loader, num_processes=2, process_index=r)] for r in (0, 1)]
    assert shards[0][0] == [0, 1, 2, 3] and shards[1][0] == [4, 5, 6, 7]
    assert len(shards[0]) == len(shards[1]) == 2  # even batches: the last global batch is completed


def test_preparing_a_prepared_loader_returns_it_unchanged():
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    loader = accelerator.prepare(DataLoader(list(range(8)), batch_size=2))
    assert accelerator.prepare(loader) is loader and accelerator.prepare_data_loader(loader) is loader
    again_model, again_loader = accelerator.prepare(model, loader)
    assert again_loader is loader and len(accelerator._dataloaders) == 1


def test_data_seed_fixes_the_seedable_shuffle_whatever_the_global_rng():
    from hasten import DataLoaderConfiguration

    def order(seed, torch_seed):
        torch.manual_seed(torch_seed)
        config = DataLoaderConfiguration(use_seedable_sampler=True, data_seed=seed)
        accelerator = Accelerator(cpu=True, dataloader_config=config)
        return [b.tolist() for b in accelerator.prepare(DataLoader(list(range(12)), batch_size=4, shuffle=True))]

    assert order(7, 0) == order(7, 1)  # the seed given decides, not torch's global RNG
    assert order(7, 0) != order(8, 0)
    assert sorted(sum(order(7, 0), [])) == list(range(12))


def test_data_seed_without_the_seedable_sampler_is_said_to_do_nothing():
    from hasten import DataLoaderConfiguration

    with pytest.warns(UserWarning, match=r"data_seed=...\) applies only with use_seedable_sampler"):
        Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(data_seed=3))
