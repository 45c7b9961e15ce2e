"""Steps per second of an elastic group at a size that divides a step's micro-batches and at one that does not
(benchmarks/elastic.py, "the cost of the weighting").

usage: _elastic_speed_train.py OUT_DIR STEPS

An MLP of about 6M parameters on synthetic data, batch 32 a process, one thread per process. The accumulation
comes from the launch (the script gives none). The main process prints one JSON line at the end: the seconds of
each optimizer step after the first 3 (warm-up), the processes and this process's micro-batches a step.
"""

import json
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator


def main() -> None:
    out, steps = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    model = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    samples = 32 * 8 * (steps + 4)  # the same on every process: at least 8 micro-batches a step for every layout
    data = TensorDataset(torch.randn(samples, 1024), torch.randn(samples, 1))
    loader = DataLoader(data, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    times: list[float] = []
    last = time.perf_counter()
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            now = time.perf_counter()
            times.append(now - last)
            last = now
            if len(times) == steps + 3:
                break
    if accelerator.is_main_process:
        print(json.dumps({"step_seconds": times[3:], "processes": accelerator.num_processes,
                          "micro_batches": accelerator.gradient_accumulation_steps, "out": out}), flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
