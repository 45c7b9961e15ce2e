"""Gradient accumulation on 2 processes: when does DDP all-reduce, when do optimizer and scheduler step?

Usage: mp_accumulation_hooks.py OUT_DIR

A DDP comm hook counts every bucket all-reduce (then does the normal
all-reduce). Two loaders are iterated with gradient_accumulation_steps=4:
one with 8 batches per rank (syncs on micro-steps 4 and 8), one with 6
(syncs on 4 and on 6, the end of the loader). Per micro-step the script
records the all-reduces done by that backward, the scheduler's step count,
whether the parameters changed, and the first layer's gradient (before the
optimizer step) so the test can compare ranks. Writes OUT_DIR/rank{N}.json.
"""

import json
import sys
from pathlib import Path

import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, set_seed

ACCUMULATION = 4
BATCH = 4


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    set_seed(0)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))  # far below one 25 MB bucket
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)

    generator = torch.Generator().manual_seed(7)
    data_a = TensorDataset(torch.randn(2 * 8 * BATCH, 3, generator=generator), torch.randn(2 * 8 * BATCH, 1, generator=generator))
    data_b = TensorDataset(torch.randn(2 * 6 * BATCH, 3, generator=generator), torch.randn(2 * 6 * BATCH, 1, generator=generator))
    loader_a = DataLoader(data_a, batch_size=BATCH)
    loader_b = DataLoader(data_b, batch_size=BATCH)
    model, optimizer, scheduler, loader_a, loader_b = accelerator.prepare(model, optimizer, scheduler, loader_a, loader_b)

    calls = {"n": 0}

    def counting_hook(state, bucket):
        calls["n"] += 1
        return allreduce_hook(state, bucket)

    model.register_comm_hook(None, counting_hook)  # state None: allreduce_hook uses the default group
    first_weight = accelerator.unwrap_model(model)[0].weight

    result = {"type": type(model).__name__, "initial_lr": scheduler.get_last_lr()[0], "loaders": {}}
    for name, loader in (("a", loader_a), ("b", loader_b)):
        steps = []
        for x, y in loader:
            before_calls = calls["n"]
            before_params = first_weight.detach().clone()
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                grad = first_weight.grad.detach().clone().flatten().tolist()
                sync = accelerator.sync_gradients
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            steps.append({
                "allreduces": calls["n"] - before_calls,
                "sync_gradients": sync,
                "scheduler_steps": scheduler.last_epoch,
                "lr": scheduler.get_last_lr()[0],
                "params_changed": not torch.equal(before_params, first_weight.detach()),
                "grad_after_backward": grad,
                "grad_cleared": first_weight.grad is None or not first_weight.grad.any().item(),
            })
        result["loaders"][name] = {"len": len(loader), "steps": steps}
    result["final_weight"] = first_weight.detach().flatten().tolist()
    (out_dir / f"rank{accelerator.process_index}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
