"""Mixed precision on 2 processes: bf16 training, and fp16 loss scaling skipping inf steps.

Usage: mp_precision.py OUT_DIR

bf16: a tiny regression model trains for a few epochs; records the output
dtype, parameter dtype and the (process-averaged) loss per epoch.

fp16: GradScaler with a small initial scale (so no step overflows by
itself); on micro-step SKIP_LOSS rank 1 alone multiplies its loss by inf
(the all-reduce spreads the non-finite gradient to rank 0), and on
micro-step SKIP_GRAD every rank writes inf into a gradient after backward.
Per step it records optimizer_step_was_skipped, whether the parameters
changed, the scheduler's step count and the loss scale.
Writes OUT_DIR/rank{N}.json.
"""

import json
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, GradScalerKwargs, set_seed

SKIP_LOSS = 2  # 0-based step indices
SKIP_GRAD = 4


def data(n: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.5
    return TensorDataset(x, y)


def model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def train_bf16() -> dict:
    set_seed(0)
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    loader = DataLoader(data(128, 1), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0))
    net, optimizer, loader = accelerator.prepare(net, optimizer, loader)
    inner: list[str] = []  # the dtype the first layer computed in (autocast), beside what forward hands back
    accelerator.unwrap_model(net)[0].register_forward_hook(lambda module, args, out: inner.append(str(out.dtype)))
    epoch_losses, output_dtype = [], None
    for _ in range(6):
        total = torch.zeros(())
        for x, y in loader:
            out = net(x)
            output_dtype = str(out.dtype)
            loss = torch.nn.functional.mse_loss(out.float(), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            total += loss.detach()
        epoch_losses.append(accelerator.reduce(total / len(loader), "mean").item())
    unwrapped = accelerator.unwrap_model(net)
    return {
        "mixed_precision": accelerator.mixed_precision,
        "output_dtype": output_dtype,
        "inner_dtype": inner[-1],
        "param_dtypes": sorted({str(p.dtype) for p in unwrapped.parameters()}),
        "epoch_losses": epoch_losses,
        "final_params": [p.detach().flatten().tolist() for p in unwrapped.parameters()],
    }


def train_fp16() -> dict:
    set_seed(0)
    accelerator = Accelerator(
        cpu=True, mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=256.0, growth_interval=10_000)]
    )
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    loader = DataLoader(data(2 * 8 * 4, 2), batch_size=4)  # 8 steps per rank
    net, optimizer, loader, scheduler = accelerator.prepare(net, optimizer, loader, scheduler)
    unwrapped = accelerator.unwrap_model(net)
    inner: list[str] = []
    unwrapped[0].register_forward_hook(lambda module, args, out: inner.append(str(out.dtype)))
    steps = []
    for i, (x, y) in enumerate(loader):
        before = [p.detach().clone() for p in unwrapped.parameters()]
        out = net(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        if i == SKIP_LOSS and accelerator.process_index == 1:
            loss = loss * float("inf")
        accelerator.backward(loss)
        if i == SKIP_GRAD:
            unwrapped[0].weight.grad[0, 0] = float("inf")
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        steps.append({
            "output_dtype": str(out.dtype),
            "inner_dtype": inner[-1],
            "skipped": accelerator.optimizer_step_was_skipped,
            "params_changed": any(not torch.equal(b, p.detach()) for b, p in zip(before, unwrapped.parameters())),
            "params_finite": all(torch.isfinite(p).all().item() for p in unwrapped.parameters()),
            "scheduler_steps": scheduler.last_epoch,
            "lr": scheduler.get_last_lr()[0],
            "scale": accelerator.scaler.get_scale(),
        })
    return {"mixed_precision": accelerator.mixed_precision, "steps": steps}


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"bf16": train_bf16(), "fp16": train_fp16()}
    rank = torch.distributed.get_rank()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
