"""The training run of faults.py written for Lightning Fabric (started by torchrun, 2 processes on CPUs).

    torchrun --nproc-per-node 2 benchmarks/_faults_train_fabric.py OUT --framework fabric

The same model, data, seed, optimizer, scheduler, accumulation and checkpoint period as
_faults_train.py, written the way Fabric's guides write them: `fabric.setup`, a DistributedSampler
with `set_epoch` (given to `setup_dataloaders` as is), accumulation with `no_backward_sync`,
`fabric.save(path, state)` of the model, optimizer, scheduler and step counter, and on a restart
`fabric.load` of the newest checkpoint, the position recomputed from the counter and the batches of
the epoch already done skipped. Fabric's checkpoint holds what `state` names: no RNG states and no
data position are added here beyond what its guide shows. Same output files as _faults_train.py.
"""

import argparse
import itertools
import json
import logging
import os
import re
import signal
import time
from pathlib import Path

import torch
from lightning.fabric import Fabric
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("out_dir", type=Path)
parser.add_argument("--framework", choices=["fabric"], default="fabric")
parser.add_argument("--accum", type=int, default=2)
parser.add_argument("--save-every", type=int, default=4, help="steps (per rank) between checkpoints")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--sleep", type=float, default=0.0, help="seconds after each step (to signal a run mid-way)")
parser.add_argument("--kill-at", type=int, default=None, help="SIGKILL this rank after this step (first start only)")
parser.add_argument("--kill-rank", type=int, default=1)
parser.add_argument("--dropout", type=float, default=0.3)
args = parser.parse_args()
logging.getLogger("lightning.fabric").setLevel(logging.WARNING)


class Counter:
    """Steps done, kept by the loop and saved in the checkpoint's state."""

    def __init__(self):
        self.steps = 0

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = state["steps"]


fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
fabric.seed_everything(0)
generator = torch.Generator().manual_seed(1234)
x = torch.randn(88, 6, generator=generator)
y = (x.sum(dim=1, keepdim=True) > 0).float()
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(args.dropout), nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.9)
dataset = TensorDataset(x, y)
sampler = DistributedSampler(dataset, num_replicas=fabric.world_size, rank=fabric.global_rank, shuffle=True, seed=0)
model, optimizer = fabric.setup(model, optimizer)
train_dl = fabric.setup_dataloaders(DataLoader(dataset, batch_size=4, sampler=sampler), use_distributed_sampler=False)
counter = Counter()
state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "counter": counter}
rank = fabric.global_rank
(args.out_dir / f"pid_rank{rank}").write_text(str(os.getpid()))

checkpoints = args.out_dir / "project" / "checkpoints"
checkpoints.mkdir(parents=True, exist_ok=True)
numbers = sorted(int(m.group(1)) for p in (checkpoints.iterdir() if checkpoints.is_dir() else ())
                 if (m := re.fullmatch(r"checkpoint_(\d+)\.ckpt", p.name)))
resumed_from = None
if numbers:
    fabric.load(checkpoints / f"checkpoint_{numbers[-1]}.ckpt", state)
    resumed_from = f"checkpoint_{numbers[-1]}"
iteration = numbers[-1] + 1 if numbers else 0
resumed_at = counter.steps
losses_file = args.out_dir / f"losses_rank{rank}.json"
losses = json.loads(losses_file.read_text()) if losses_file.exists() else {}
start_epoch, skip = divmod(counter.steps, len(train_dl))
killed_marker = args.out_dir / "killed_once"

loss_fn = nn.BCEWithLogitsLoss()
for epoch in range(start_epoch, args.epochs):
    model.train()
    sampler.set_epoch(epoch)
    first = skip if epoch == start_epoch else 0
    for index, (inputs, targets) in enumerate(itertools.islice(train_dl, first, None), start=first):
        sync = (index + 1) % args.accum == 0 or index + 1 == len(train_dl)
        with fabric.no_backward_sync(model, enabled=not sync):
            loss = loss_fn(model(inputs), targets)
            fabric.backward(loss / args.accum)
        if sync:
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        counter.steps += 1
        losses[str(counter.steps)] = loss.item().hex()
        losses_file.write_text(json.dumps(losses))
        if args.sleep:
            time.sleep(args.sleep)
        if counter.steps % args.save_every == 0:
            fabric.save(checkpoints / f"checkpoint_{iteration}.ckpt", state)
            iteration += 1
        if args.kill_at == counter.steps and rank == args.kill_rank and not killed_marker.exists():
            killed_marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)

torch.save({k: v.clone() for k, v in model.module.state_dict().items()}, args.out_dir / f"final_rank{rank}.pt")
(args.out_dir / f"done_rank{rank}.json").write_text(json.dumps({"steps": counter.steps, "resumed_from": resumed_from,
                                                               "resumed_at_step": resumed_at}))
