"""A training run that checkpoints, can die, and resumes: the subject of the resume tests.

usage: ckpt_train.py OUT_DIR [--way accelerate|stateful] [--save-every K] [--kill-at STEP] [--kill-rank R]
                     [--accum A] [--epochs E] [--sleep S] [--total-limit N]

Per-step losses (as float.hex, keyed by global step) go to OUT_DIR/losses_rank{R}.json and the final
parameters to OUT_DIR/final_rank{R}.pt, so a test can compare runs bit for bit. Dropout, shuffling,
AdamW, a scheduler, accumulation and a registered counter are all part of what must resume exactly.
"""

import argparse
import json
import os
import signal
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, DataLoaderConfiguration
from hasten.utils import ProjectConfiguration, set_seed

parser = argparse.ArgumentParser()
parser.add_argument("out_dir", type=Path)
parser.add_argument("--way", choices=["accelerate", "stateful"], default="stateful")
parser.add_argument("--save-every", type=int, default=5)
parser.add_argument("--kill-at", type=int, default=None, help="SIGKILL this process at this step (first attempt only)")
parser.add_argument("--kill-rank", type=int, default=0)
parser.add_argument("--accum", type=int, default=1)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--total-limit", type=int, default=2)
parser.add_argument("--samples", type=int, default=88)
parser.add_argument("--generator", action="store_true", help="give the DataLoader its own generator")
parser.add_argument("--die-while-saving", type=int, default=None,
                    help="SIGKILL this process in the middle of writing its N-th checkpoint (first attempt only)")
args = parser.parse_args()


class Counter:
    """Training progress kept by the user's loop (a registered object)."""

    def __init__(self):
        self.steps = 0

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = state["steps"]


class DieWhileSaving:
    """Registered after the counter: its state_dict runs while the checkpoint's files are being written."""

    def __init__(self):
        self.saves = 0

    def state_dict(self):
        self.saves += 1
        if self.saves == args.die_while_saving and not killed_marker.exists():
            killed_marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return {}

    def load_state_dict(self, state):
        pass


killed_marker = args.out_dir / "killed_once"
set_seed(0)
data_gen = torch.Generator().manual_seed(1234)
x = torch.randn(args.samples, 6, generator=data_gen)
y = (x.sum(dim=1, keepdim=True) > 0).float()
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.9)
loader_kwargs = {"generator": torch.Generator().manual_seed(5)} if args.generator else {}
train_dl = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True, **loader_kwargs)

accelerator = Accelerator(
    cpu=True,
    gradient_accumulation_steps=args.accum,
    project_config=ProjectConfiguration(args.out_dir / "project", automatic_checkpoint_naming=True,
                                        total_limit=args.total_limit),
    dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=args.way == "stateful"),
)
model, optimizer, train_dl, scheduler = accelerator.prepare(model, optimizer, train_dl, scheduler)
counter = Counter()
accelerator.register_for_checkpointing(counter, DieWhileSaving())

rank = accelerator.process_index
(args.out_dir / f"pid_rank{rank}").write_text(str(os.getpid()))
losses_file = args.out_dir / f"losses_rank{rank}.json"
losses = json.loads(losses_file.read_text()) if losses_file.exists() else {}
resumed = accelerator.load_state()  # the one line: a no-op on the first start

if args.way == "stateful":
    start_epoch, skip = train_dl.epoch, 0
else:  # Accelerate's way: compute where to start from the user's own counter, skip with skip_first_batches
    batches_done = counter.steps
    start_epoch, skip = divmod(batches_done, len(train_dl))

loss_fn = nn.BCEWithLogitsLoss()
for epoch in range(start_epoch, args.epochs):
    model.train()
    active = train_dl
    if args.way == "accelerate":
        train_dl.set_epoch(epoch)
        if epoch == start_epoch and skip:
            active = accelerator.skip_first_batches(train_dl, skip)
    for inputs, targets in active:
        with accelerator.accumulate(model):
            loss = loss_fn(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        counter.steps += 1
        losses[str(counter.steps)] = loss.item().hex()
        losses_file.write_text(json.dumps(losses))
        if args.sleep:
            time.sleep(args.sleep)
        if counter.steps % args.save_every == 0:
            accelerator.save_state()
        if args.kill_at == counter.steps and rank == args.kill_rank and not killed_marker.exists():
            killed_marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)

unwrapped = accelerator.unwrap_model(model)
torch.save({k: v.clone() for k, v in unwrapped.state_dict().items()}, args.out_dir / f"final_rank{rank}.pt")
(args.out_dir / f"done_rank{rank}").write_text(json.dumps({"steps": counter.steps, "resumed": resumed}))
accelerator.end_training()
