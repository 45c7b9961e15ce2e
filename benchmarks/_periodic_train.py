"""The cost of hasten's periodic asynchronous checkpoints, measured inside one 2-process DDP run (benchmarks/elastic.py).

usage: _periodic_train.py OUT_DIR ROUNDS STEPS EVERY

Rounds alternate: STEPS training steps with periodic checkpoints every EVERY optimizer steps
(`ProjectConfiguration(save_every_n_steps=EVERY)`: in the background, at the boundary after the step), and the
same STEPS without. Each process times its steps; the main process prints one JSON line per round. The model is
an MLP of about 6M parameters (75 MB with its AdamW state), the step about 100 ms on one thread.
"""

import json
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, ProjectConfiguration
from hasten.checkpointing.periodic import PeriodicSaves


def main() -> None:
    out, rounds, steps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(
        out, automatic_checkpoint_naming=True, total_limit=2, save_every_n_steps=every))
    watch = accelerator._boundary_watch  # the benchmark switches the periodic policy on and off between rounds
    policy, saver = watch.periodic, watch.save_periodic
    model = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = TensorDataset(torch.randn(64 * steps * 2, 1024), torch.randn(64 * steps * 2, 1))
    loader = DataLoader(data, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    batches = iter(loader)
    for round_number in range(rounds * 2):
        with_saves = round_number % 2 == 0  # alternate, starting with saves (the first also warms up both)
        watch.periodic = PeriodicSaves(every_steps=every) if with_saves else None
        watch.save_periodic = saver if with_saves else None
        start = time.perf_counter()
        for _ in range(steps):
            try:
                x, y = next(batches)
            except StopIteration:
                batches = iter(loader)
                x, y = next(batches)
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        next(batches, None)  # the boundary after the last step (where a save due then happens)
        batches = iter(loader)
        accelerator.wait_for_everyone()
        seconds = time.perf_counter() - start
        if accelerator.is_main_process:
            print(json.dumps({"round": round_number // 2, "saves": with_saves, "seconds": seconds, "steps": steps}),
                  flush=True)
    watch.periodic = policy
    accelerator.end_training()


if __name__ == "__main__":
    main()
