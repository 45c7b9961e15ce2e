"""prepare_data_loader(torch_device_mesh=...) on 4 real processes, under hasten or under Accelerate itself.

Usage: mesh_loader.py LIBRARY OUT_DIR   (LIBRARY: hasten | accelerate; writes OUT_DIR/LIBRARY_rank{N}.json)

For several 2-D and 1-D meshes over the 4 processes and several loaders (batch sizes, split, uneven,
dispatch, a stream, a shuffle after set_seed), each rank records the batches it reads and len(), or
the error prepare raised; the test compares the two libraries rank by rank. hasten's run also
records the warnings prepare gave.
"""

import json
import os
import sys
import warnings
from pathlib import Path

import torch
from torch.utils.data import DataLoader, IterableDataset

LIBRARY, OUT = sys.argv[1], Path(sys.argv[2])
if LIBRARY == "accelerate":
    from accelerate import PartialState
    from accelerate.data_loader import prepare_data_loader
    from accelerate.utils import set_seed
else:
    from hasten import PartialState
    from hasten.data_loader import prepare_data_loader
    from hasten.utils import set_seed

from torch.distributed.device_mesh import init_device_mesh

MESHES = [((2, 2), ("dp", "tp")), ((2, 2), ("dp_shard", "tp")), ((2, 2), ("dp_replicate", "cp")), ((4,), ("tp",)),
          ((2, 2), ("dp_shard", "sp"))]
CASES = ["plain", "bs3", "split", "uneven", "shuffle", "dispatch", "dispatch_split", "stream"]


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(22))


def loader(case: str) -> tuple[DataLoader, dict]:
    data, loader_kwargs, prepare_kwargs = list(range(22)), {"batch_size": 2}, {}
    if case in ("bs3", "uneven"):
        loader_kwargs["batch_size"] = 3
    if case == "uneven":
        prepare_kwargs["even_batches"] = False
    if case in ("split", "dispatch_split"):
        loader_kwargs["batch_size"] = 4
        prepare_kwargs["split_batches"] = True
    if case == "shuffle":
        set_seed(7)
        loader_kwargs["shuffle"] = True
    if case.startswith(("dispatch", "stream")):  # a stream is dispatched by default when batches go to the device
        prepare_kwargs.update(put_on_device=True, device=torch.device("cpu"))
    if case.startswith("dispatch"):
        prepare_kwargs["dispatch_batches"] = True
    if case == "stream":
        data = Stream()
    return DataLoader(data, **loader_kwargs), prepare_kwargs


def main() -> None:
    PartialState(cpu=True)
    results = {}
    for shape, names in MESHES:
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        for case in CASES:
            dataloader, kwargs = loader(case)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    prepared = prepare_data_loader(dataloader, torch_device_mesh=mesh, **kwargs)
                    record = {"batches": [batch.tolist() for batch in prepared]}
                    try:
                        record["len"] = len(prepared)
                    except TypeError:
                        record["len"] = None
                except Exception as error:  # what each library raises is compared
                    record = {"error": type(error).__name__, "message": str(error)}
            record["warnings"] = [str(w.message) for w in caught if "prepare_data_loader" in str(w.message)
                                  or "dispatch_batches" in str(w.message)]
            results[f"{'x'.join(names)}:{case}"] = record
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{LIBRARY}_rank{os.environ['RANK']}.json").write_text(json.dumps(results))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
