"""dispatch_batches=True on real processes: only rank 0 reads; each rank gets its rows; gather_for_metrics; resume.

Usage: mp_dispatch.py OUT_DIR   (writes OUT_DIR/rank{N}.json)
"""

import json
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from hasten import Accelerator, DataLoaderConfiguration


class OnlyRankZeroReads(Dataset):
    """Sample i is {"x": [i, -i], "name": "s<i>"}; reading it on another rank is an error."""

    def __len__(self) -> int:
        return 11

    def __getitem__(self, i: int):
        if int(os.environ.get("RANK", "0")) != 0:
            raise RuntimeError(f"rank {os.environ['RANK']} read sample {i}")
        return {"x": torch.tensor([float(i), -float(i)]), "name": f"s{i}"}


def main(out: Path) -> None:
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=True, use_stateful_dataloader=True))
    loader = accelerator.prepare(DataLoader(OnlyRankZeroReads(), batch_size=2, shuffle=True))
    batches, gathered = [], []
    for batch in loader:
        batches.append({"x": batch["x"][:, 0].tolist(), "name": batch["name"]})
        gathered += accelerator.gather_for_metrics(batch["x"][:, 0]).tolist()
    # mid-epoch position: take 1 batch, save, and resume in a fresh loader
    iterator = iter(loader)
    first = next(iterator)["x"][:, 0].tolist()
    accelerator.save_state(str(out / "ckpt"))
    rest_before = [b["x"][:, 0].tolist() for b in iterator]
    accelerator.load_state(str(out / "ckpt"))  # back to one batch into the second epoch
    rest_after = [b["x"][:, 0].tolist() for b in loader]
    result = {"len": len(loader), "batches": batches, "gathered": gathered, "first": first,
              "rest_before": rest_before, "rest_after": rest_after, "device": str(batch["x"].device)}
    (out / f"rank{accelerator.process_index}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
