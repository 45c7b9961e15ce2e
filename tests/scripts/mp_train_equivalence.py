"""Train a small fp32 MLP under several configurations; the main process saves the final parameters.

Usage: mp_train_equivalence.py OUT_DIR CONFIG [CONFIG ...]

Each CONFIG is ``name:batch_size:accumulation_steps:split_batches:optimizer``,
e.g. ``accum:8:4:0:sgd``. Every configuration starts from `set_seed` (same
initial weights, same shuffle seed on every process), trains on the same
generated regression data, and writes ``OUT_DIR/{name}.safetensors`` (final
parameters) and ``OUT_DIR/{name}.init.safetensors`` (initial parameters).
Run on 1 process with the global batch and on N processes with the
per-process batch, the final parameters must agree.
"""

import json
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, set_seed, DataLoaderConfiguration

NUM_SAMPLES = 128
EPOCHS = 3


def make_data() -> TensorDataset:
    generator = torch.Generator().manual_seed(1234)  # independent of set_seed: same data everywhere
    x = torch.randn(NUM_SAMPLES, 6, generator=generator)
    true_w = torch.randn(6, 1, generator=generator)
    y = torch.sin(x @ true_w) + 0.1 * torch.randn(NUM_SAMPLES, 1, generator=generator)
    return TensorDataset(x, y)


def run(out_dir: Path, name: str, batch_size: int, accumulation: int, split_batches: bool, optimizer_name: str) -> None:
    set_seed(42)
    # The seedable sampler shuffles by (seed, epoch) alone, so 1 and N processes visit the same global order
    # (without it, as under Accelerate, one process draws from the global RNG and N from a seeded generator).
    config = DataLoaderConfiguration(split_batches=split_batches, use_seedable_sampler=True)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation, dataloader_config=config)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if optimizer_name == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    loader = DataLoader(make_data(), batch_size=batch_size, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    losses = []
    micro_batches = 0
    for _ in range(EPOCHS):
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            micro_batches += 1
            losses.append(accelerator.reduce(loss.detach(), "mean").item())

    final = {k: v.detach().clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}
    accelerator.save(final, out_dir / f"{name}.safetensors", safe_serialization=True)
    accelerator.save(init, out_dir / f"{name}.init.safetensors", safe_serialization=True)
    info = {"micro_batches": micro_batches, "loader_len": len(loader), "first_loss": losses[0], "last_loss": losses[-1]}
    (out_dir / f"{name}.rank{accelerator.process_index}.json").write_text(json.dumps(info))
    accelerator.wait_for_everyone()


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    for config in sys.argv[2:]:
        name, batch_size, accumulation, split, optimizer_name = config.split(":")
        run(out_dir, name, int(batch_size), int(accumulation), split == "1", optimizer_name)


if __name__ == "__main__":
    main()
