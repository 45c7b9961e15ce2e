"""save_state inside `if accelerator.is_main_process:` (the diffusers pattern), then load_state on every process.

usage: ckpt_main_only.py OUT_DIR ENGINE WHO
  ENGINE: ddp | fsdp      WHO: main (only the main process saves) | all (every process saves)

Trains 3 steps, saves to OUT_DIR/ckpt, trains 2 more steps (under `main`, the
other processes run ahead into DDP's all-reduce while the main process
saves), then every process loads the checkpoint and checks that the model
is the saved one again. Each rank writes OUT_DIR/rank<R>.json.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, set_seed

out, engine, who = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
set_seed(0)
kwargs = {}
if engine == "fsdp":
    from hasten import FullyShardedDataParallelPlugin

    kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin()
accelerator = Accelerator(cpu=True, **kwargs)
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
data = TensorDataset(torch.randn(64, 6, generator=torch.Generator().manual_seed(1)), torch.randn(64, 1))
loader = DataLoader(data, batch_size=4, shuffle=True)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)


class Counter:
    def __init__(self):
        self.steps = 0

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = state["steps"]


counter = Counter()
accelerator.register_for_checkpointing(counter)
rank = accelerator.process_index
report = {"rank": rank}
batches = iter(loader)
for step in range(5):
    x, y = next(batches)
    loss = nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    counter.steps += 1
    if step == 2:
        saved = {k: v.clone() for k, v in accelerator.get_state_dict(model).items()} if engine == "ddp" else None
        report["saved_lr"] = scheduler.get_last_lr()
        if who == "all" or accelerator.is_main_process:
            started = time.monotonic()
            try:
                path = accelerator.save_state(out / "ckpt")
                report["save_seconds"] = time.monotonic() - started
                report["path"] = path
            except Exception as error:  # noqa: BLE001 - the test reads it
                report["save_error"] = f"{type(error).__name__}: {error}"
                report["save_seconds"] = time.monotonic() - started
                (out / f"rank{rank}.json").write_text(json.dumps(report))
                raise
accelerator.wait_for_everyone()
report["files"] = sorted(os.listdir(out / "ckpt"))
accelerator.load_state(out / "ckpt")
if engine == "ddp":
    now = accelerator.get_state_dict(model)
    report["model_restored"] = all(torch.equal(now[k], saved[k]) for k in saved)
report["counter"] = counter.steps
report["lr"] = scheduler.get_last_lr()
report["save_iteration"] = accelerator.save_iteration
(out / f"rank{rank}.json").write_text(json.dumps(report))
accelerator.end_training()
