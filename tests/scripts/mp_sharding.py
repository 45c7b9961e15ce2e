"""Record which samples each rank sees, per epoch, for several loader set-ups; and gather_for_metrics.

Usage: mp_sharding.py OUT_DIR

Writes OUT_DIR/rank{N}.json with, per case, `len(prepared_loader)` and the
batches of sample indices this rank got in each epoch.
"""

import json
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from hasten import Accelerator, DataLoaderConfiguration, set_seed


class Indices(Dataset):
    """Sample i is the integer i."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class IterIndices(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


class SizedIterIndices(IterIndices):
    """An iterable dataset that knows its length (like a streamed dataset with a known size)."""

    def __len__(self) -> int:
        return self.n


class Records(Dataset):
    """Nested samples for gather_for_metrics: a tensor, a dict with a 2-d tensor, and a string."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return {"index": torch.tensor(i), "pair": {"feat": torch.tensor([float(i), -float(i)])}, "name": f"s{i}"}


def batches_of(loader, epochs: int):
    return [[[int(i) for i in batch] for batch in loader] for _ in range(epochs)]


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    # different RNG state per rank: only the agreed (broadcast) shuffle seed can make the ranks agree
    set_seed(3, device_specific=True)
    result = {}

    # 33 samples, batch 4, 2 ranks: 9 inner batches (the last one has 1 sample) -> uneven per rank.
    for even in (False, True):
        for shuffle in (False, True):
            accelerator = Accelerator(cpu=True, even_batches=even)
            loader = accelerator.prepare(DataLoader(Indices(33), batch_size=4, shuffle=shuffle))
            epochs = batches_of(loader, 2)
            loader.set_epoch(0)  # replaying epoch 0 gives the same shuffle
            replay = batches_of(loader, 1)[0]
            result[f"map_even{int(even)}_shuffle{int(shuffle)}"] = {"len": len(loader), "epochs": epochs, "replay0": replay}

    # split_batches: the batch size is global (8), each rank gets 4 per step
    for even in (False, True):
        accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(split_batches=True, even_batches=even))
        loader = accelerator.prepare(DataLoader(Indices(33), batch_size=8, shuffle=True))
        result[f"split_even{int(even)}"] = {"len": len(loader), "epochs": batches_of(loader, 2)}

    # iterable dataset: 37 items, batch 4 per rank
    for even in (False, True):
        accelerator = Accelerator(cpu=True, even_batches=even)
        loader = accelerator.prepare(DataLoader(IterIndices(37), batch_size=4))
        result[f"iter_even{int(even)}"] = {"epochs": batches_of(loader, 1)}

    # sized iterable dataset: len(prepared_loader) and gather_for_metrics must know the length too
    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(DataLoader(SizedIterIndices(37), batch_size=4))
    try:
        length = len(loader)
    except TypeError as error:  # recorded, so the test can show the error
        length = f"{type(error).__name__}: {error}"
    batches, gathered = [], []
    for batch in loader:
        batches.append(batch.tolist())
        gathered += accelerator.gather_for_metrics(batch).tolist()
    result["sized_iter"] = {"len": length, "batches": batches, "gathered": gathered}

    # gather_for_metrics: 101 samples, batch 8, 2 ranks -> the padded last step must be trimmed
    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(DataLoader(Records(101), batch_size=8))
    indices, feats, names, per_step_local = [], [], [], []
    for batch in loader:
        per_step_local.append(len(batch["index"]))
        gathered = accelerator.gather_for_metrics({"index": batch["index"], "pair": batch["pair"]})
        indices += gathered["index"].tolist()
        feats += gathered["pair"]["feat"].tolist()
        names += accelerator.gather_for_metrics(batch["name"])  # list of str -> gather_object path
    # plain gather of the same loader: padded (duplicates kept)
    plain = []
    for batch in loader:
        plain += accelerator.gather(batch["index"]).tolist()
    # a loader whose size is a multiple of the global batch: nothing may be dropped
    exact_loader = accelerator.prepare(DataLoader(Records(32), batch_size=8))
    exact = []
    for batch in exact_loader:
        exact += accelerator.gather_for_metrics(batch["index"]).tolist()
    # shuffled, and split_batches (global batch 16): still every sample exactly once
    for name, split in (("gfm_shuffled", False), ("gfm_split", True)):
        accelerator = Accelerator(cpu=True, split_batches=split)
        shuffled = accelerator.prepare(DataLoader(Indices(101), batch_size=16 if split else 8, shuffle=True))
        values = []
        for batch in shuffled:
            values += accelerator.gather_for_metrics(batch).tolist()
        result[name] = values
    result["gather_for_metrics"] = {
        "len": len(loader),
        "local_batch_sizes": per_step_local,
        "indices": indices,
        "feats": feats,
        "names": names,
        "plain_gather": plain,
        "exact": exact,
    }

    (out_dir / f"rank{accelerator.process_index}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
