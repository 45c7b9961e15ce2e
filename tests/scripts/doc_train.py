"""The `train.py` of the docs' multi-machine commands, which tests/test_doc_commands.py runs as the pages write them.

usage: train.py   (no arguments: the commands on the pages give none)

An ordinary script: a tiny linear model, plain SGD, a prepared DataLoader of per-process batch 1 over SAMPLES
samples in order, one epoch. Each process writes results/rank<R>.json (in the working directory) with what it saw:
the group's size, `gradient_accumulation_steps`, the optimizer steps, the sample indices of each step, the final
parameters, and how it was started (the variables the launcher, torchrun, srun or the test set; the host name).
`reference(max_processes)` is the same training in one plain process with the global batch of MAX processes, which
the run must reproduce at any size.
"""

import json
import os
import socket
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SAMPLES, LR = 128, 0.05
RECORDED = ("GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "GLOO_SOCKET_IFNAME", "HASTEN_MACHINE",
            "SLURM_NODEID", "SLURMD_NODENAME", "DOC_MACHINE")


def build() -> tuple[nn.Module, TensorDataset]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, 4, generator=generator)
    y = x @ torch.tensor([[0.5], [-1.0], [2.0], [0.25]]) + 0.1 * torch.randn(SAMPLES, 1, generator=generator)
    torch.manual_seed(0)
    return nn.Linear(4, 1), TensorDataset(x, y, torch.arange(SAMPLES))


def reference(max_processes: int) -> dict[str, torch.Tensor]:
    """The final parameters of one plain process stepping on consecutive global batches of `max_processes` samples."""
    model, data = build()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    x, y, _ = data.tensors
    for start in range(0, SAMPLES, max_processes):
        nn.functional.mse_loss(model(x[start:start + max_processes]), y[start:start + max_processes]).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {name: value.detach() for name, value in model.state_dict().items()}


def main() -> None:
    from hasten import Accelerator

    accelerator = Accelerator()
    model, data = build()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=1))
    steps: list[list[int]] = [[]]
    for inputs, targets, index in loader:
        with accelerator.accumulate(model):
            accelerator.backward(nn.functional.mse_loss(model(inputs), targets))
            optimizer.step()
            optimizer.zero_grad()
        steps[-1] += index.tolist()
        if accelerator.sync_gradients:
            steps.append([])
    result = {"rank": accelerator.process_index, "world": accelerator.num_processes,
              "accumulation": accelerator.gradient_accumulation_steps, "steps": [s for s in steps if s],
              "parameters": {k: v.tolist() for k, v in accelerator.unwrap_model(model).state_dict().items()},
              "hostname": socket.gethostname(), "env": {name: os.environ.get(name) for name in RECORDED}}
    out = Path("results")
    out.mkdir(exist_ok=True)
    (out / f"rank{accelerator.process_index}.json").write_text(json.dumps(result))
    accelerator.end_training()


if __name__ == "__main__":
    main()
