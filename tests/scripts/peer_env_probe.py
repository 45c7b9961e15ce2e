"""What a script written for Accelerate observes under `hasten launch`: variables and distributed types.

Writes ``rank{R}_attempt{A}.json`` into OUT (A = TORCHELASTIC_RESTART_COUNT).
With ``--fail-first`` the first attempt trains one batch (so the launcher
sees progress and restarts) and then fails on the last rank.
"""

import json
import os
import sys
from pathlib import Path

import torch

from hasten import Accelerator, PartialState
from hasten.state import AcceleratorState
from hasten.utils import copy_tensor_to_devices

NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
         "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "ACCELERATE_MIXED_PRECISION",
         "ACCELERATE_USE_CPU", "ACCELERATE_DYNAMO_BACKEND", "ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED")

out = Path(sys.argv[1])
record = {"env": {name: os.environ.get(name) for name in NAMES}}
record["before"] = PartialState().distributed_type.value
accelerator = Accelerator()
record["after"] = [PartialState().distributed_type.value, accelerator.state.distributed_type.value,
                   AcceleratorState().distributed_type.value]
# the tensor exists on the last process only; every process gets it (shape and dtype unknown elsewhere)
held = torch.tensor([[1, 2, 3]], dtype=torch.int32) if accelerator.is_last_process else None
record["copied"] = copy_tensor_to_devices(held).tolist()
attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "none")
if "--fail-first" in sys.argv and attempt == "0":
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for step, batch in enumerate(loader):  # asking for batch 1 marks batch 0 done: the launcher's progress
        if step == 1:
            break
        accelerator.backward(model(batch).sum())
        optimizer.step()
    accelerator.wait_for_everyone()
    if accelerator.is_last_process:
        raise RuntimeError("first attempt fails on purpose")
    accelerator.wait_for_everyone()  # the others wait here until the launcher stops them
(out / f"rank{accelerator.process_index}_attempt{attempt}.json").write_text(json.dumps(record))
