"""Train a small MLP under DeepSpeed in a given precision; write the losses and the engine's parameter dtype.

Usage: ds_precision.py OUT_DIR STAGE PRECISION [PRECISION ...]
"""

import json
import sys
from pathlib import Path

import torch

from hasten import Accelerator, DeepSpeedPlugin, set_seed
from hasten.state import AcceleratorState


def run(out: Path, stage: int, precision: str) -> None:
    set_seed(0)
    accelerator = Accelerator(cpu=True, mixed_precision=precision, deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage))
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 8, generator=g)
    y = x.sum(1, keepdim=True).sin()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for _ in range(3):
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb).float(), yb)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(accelerator.reduce(loss.detach(), "mean").item())
    dtype = str(next(model.parameters()).dtype)
    if accelerator.is_main_process:
        (out / f"{precision}.json").write_text(json.dumps({"losses": losses, "dtype": dtype}))
    accelerator.wait_for_everyone()
    accelerator.free_memory()
    AcceleratorState._reset_state()  # a later Accelerator would share this one's plugin (as in Accelerate)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for precision in sys.argv[3:]:
        run(out, int(sys.argv[2]), precision)


if __name__ == "__main__":
    main()
