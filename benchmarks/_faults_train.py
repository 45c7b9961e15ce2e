"""The training run of faults.py: checkpoints, can be killed or preempted, resumes. One script for hasten and Accelerate.

    hasten launch --num_processes 2 benchmarks/_faults_train.py OUT --framework hasten
    accelerate launch --multi_gpu --num_processes 2 benchmarks/_faults_train.py OUT --framework accelerate

Only the import lines differ between the two: the same model (with dropout), data (shuffled, with
Accelerate's `use_seedable_sampler=True` for a reproducible shuffle), seed, AdamW, scheduler, gradient
accumulation, periodic `save_state()` with automatic checkpoint naming, and resumption the way
Accelerate's checkpointing guide writes it, which hasten accepts unchanged:
`load_state()` of the latest checkpoint, the checkpoint numbering continued past it, the position
recomputed from a registered step counter, and `skip_first_batches` for the batches of the epoch
already done. Per-step losses (float.hex, keyed by step) go to OUT/losses_rank{R}.json after every
step and the final parameters to OUT/final_rank{R}.pt, so runs can be compared bit for bit.
Nothing here handles signals: what a preemption signal does is the framework's doing.
"""

import argparse
import json
import os
import re
import signal
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("out_dir", type=Path)
parser.add_argument("--framework", choices=["hasten", "accelerate"], required=True)
parser.add_argument("--accum", type=int, default=2)
parser.add_argument("--save-every", type=int, default=4, help="steps (per rank) between checkpoints")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--sleep", type=float, default=0.0, help="seconds after each step (to signal a run mid-way)")
parser.add_argument("--kill-at", type=int, default=None, help="SIGKILL this rank after this step (first start only)")
parser.add_argument("--kill-rank", type=int, default=1)
parser.add_argument("--dropout", type=float, default=0.3)
args = parser.parse_args()

if args.framework == "hasten":
    from hasten import Accelerator, DataLoaderConfiguration
    from hasten.utils import ProjectConfiguration, set_seed
else:
    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.utils import ProjectConfiguration, set_seed


class Counter:
    """Steps done, kept by the loop and registered for checkpointing."""

    def __init__(self):
        self.steps = 0

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = state["steps"]


set_seed(0)
generator = torch.Generator().manual_seed(1234)
x = torch.randn(88, 6, generator=generator)
y = (x.sum(dim=1, keepdim=True) > 0).float()
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(args.dropout), nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.9)
train_dl = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)

project = args.out_dir / "project"
# use_seedable_sampler: Accelerate's setting for a shuffle that resumes reproducibly (hasten's always does)
accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accum,
                          project_config=ProjectConfiguration(project, automatic_checkpoint_naming=True, total_limit=2),
                          dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
model, optimizer, train_dl, scheduler = accelerator.prepare(model, optimizer, train_dl, scheduler)
counter = Counter()
accelerator.register_for_checkpointing(counter)
rank = accelerator.process_index
(args.out_dir / f"pid_rank{rank}").write_text(str(os.getpid()))

checkpoints = project / "checkpoints"
numbers = sorted(int(m.group(1)) for p in (checkpoints.iterdir() if checkpoints.is_dir() else ())
                 if (m := re.fullmatch(r"checkpoint_(\d+)", p.name)))
resumed_from = None
if numbers:
    accelerator.load_state()  # automatic naming: the latest checkpoint
    accelerator.project_configuration.iteration = numbers[-1] + 1
    resumed_from = f"checkpoint_{numbers[-1]}"
resumed_at = counter.steps
losses_file = args.out_dir / f"losses_rank{rank}.json"
losses = json.loads(losses_file.read_text()) if losses_file.exists() else {}
start_epoch, skip = divmod(counter.steps, len(train_dl))
killed_marker = args.out_dir / "killed_once"

loss_fn = nn.BCEWithLogitsLoss()
for epoch in range(start_epoch, args.epochs):
    model.train()
    train_dl.set_epoch(epoch)
    active = accelerator.skip_first_batches(train_dl, skip) if epoch == start_epoch and skip else train_dl
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
(args.out_dir / f"done_rank{rank}.json").write_text(json.dumps({"steps": counter.steps, "resumed_from": resumed_from,
                                                          "resumed_at_step": resumed_at}))
accelerator.end_training()
