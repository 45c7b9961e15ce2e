"""Two processes: what scripts and libraries written for Accelerate do that needs a process group.

- `join_uneven_inputs` on a run whose state says FSDP (Accelerate's own test script sets it so, and hands it a
  `Mock`) warns and runs the block; overriding `even_batches` with an iterable loader prepared warns.
- `save_state` given a different directory on each process (Accelerate's test scripts use a `tempfile` directory
  per process): the main process's holds the shared files, each its own RNG and loader state; `load_state` of each
  process's own directory resumes its loader where it was; with a model, a process whose directory has no shared
  files is told so in one sentence; with `async_save` it is refused in one sentence.

Each rank writes rank{N}.json into argv[1]; tests/test_library_attributes.py reads them.
"""

import json
import os
import sys
import warnings
from pathlib import Path
from unittest.mock import Mock

import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from hasten import Accelerator
from hasten.utils import DataLoaderConfiguration, DistributedType

out = Path(sys.argv[1])
accelerator = Accelerator(cpu=True)
rank = accelerator.process_index
result = {}


class Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(8.0))


def warned(block):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        block()
    return [str(w.message) for w in caught]


# -- join_uneven_inputs outside DDP: a warning, and the block runs -------------------------------------------------
joiner = Accelerator(cpu=True)  # its own: `accelerator` below saves loaders only, as Accelerate's test script does
ddp_model = joiner.prepare(torch.nn.Linear(1, 1))
original = joiner.state.distributed_type
joiner.state.distributed_type = DistributedType.FSDP  # the state is every Accelerator's of the process, as in Accelerate
result["distributed_type_follows_state"] = joiner.distributed_type == DistributedType.FSDP


def join_mock():
    with joiner.join_uneven_inputs([Mock()]):
        result["join_block_ran"] = True


result["join_warnings"] = warned(join_mock)
joiner.state.distributed_type = original
joiner.prepare(DataLoader(Stream(), batch_size=2))  # dispatched: its batches cannot be evened out per process


def join_override():
    with joiner.join_uneven_inputs([ddp_model], even_batches=False):
        pass


result["override_warnings"] = warned(join_override)

# -- save_state / load_state with a directory per process (Accelerate's test_stateful_dataloader_save_state) --------
own_dir = out / f"own{rank}"
accelerator.dataloader_config = DataLoaderConfiguration(use_stateful_dataloader=True)
loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(16)), batch_size=2, shuffle=True))
seen = []
for step, (batch,) in enumerate(loader):
    if step == 1:
        result["saved_to"] = accelerator.save_state(own_dir)
    if step > 1:
        seen.append(batch.tolist())
accelerator.load_state(own_dir)
result["resumed_same_batches"] = [batch.tolist() for (batch,) in loader] == seen
result["own_files"] = sorted(os.listdir(own_dir))
result["own_manifest"] = {k: v for k, v in json.loads((own_dir / "hasten_checkpoint.json").read_text()).items()
                          if k in ("saved_by", "split", "shared")}

# -- with a model: the shared files go to the main process's directory only ----------------------------------------
trainer = Accelerator(cpu=True)
model, optimizer = trainer.prepare(torch.nn.Linear(2, 1), torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1))
model_dir = out / f"model{rank}"
trainer.save_state(model_dir)
result["model_files"] = sorted(os.listdir(model_dir))
try:
    trainer.load_state(model_dir)
    result["model_load"] = "loaded"
except ValueError as error:
    result["model_load"] = f"{type(error).__name__}: {error}"
try:
    trainer.save_state(out / f"async{rank}", async_save=True)
    result["async"] = "saved"
except ValueError as error:
    result["async"] = f"{type(error).__name__}: {error}"

(out / f"rank{rank}.json").write_text(json.dumps(result))
trainer.end_training()
