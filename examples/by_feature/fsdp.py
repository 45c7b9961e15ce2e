"""FSDP2: parameters, gradients and optimizer state sharded across processes.

This is base.py plus the lines marked ``# New Code #``.
"""

import argparse

import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, FullyShardedDataParallelPlugin, set_seed


def get_dataloaders(batch_size: int):
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    generator = torch.Generator().manual_seed(0)  # the same split on every process
    order = torch.randperm(len(x), generator=generator)
    train, valid = order[:1437], order[1437:]
    train_dl = DataLoader(TensorDataset(x[train], y[train]), batch_size=batch_size, shuffle=True)
    eval_dl = DataLoader(TensorDataset(x[valid], y[valid]), batch_size=64)
    return train_dl, eval_dl


def training_function(args):
    # New Code #
    # each process holds 1/N of every Linear (its own FSDP unit); checkpoints are written sharded
    fsdp_plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="SIZE_BASED_WRAP", min_num_params=1000,
                                                 state_dict_type="SHARDED_STATE_DICT")
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision, fsdp_plugin=fsdp_plugin)
    set_seed(args.seed)
    train_dl, eval_dl = get_dataloaders(args.batch_size)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer, train_dl, eval_dl = accelerator.prepare(model, optimizer, train_dl, eval_dl)

    for epoch in range(args.num_epochs):
        model.train()
        for x, y in train_dl:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()

        model.eval()
        correct = total = 0
        for x, y in eval_dl:
            with torch.no_grad():
                predictions = model(x).argmax(dim=-1)
            predictions, references = accelerator.gather_for_metrics((predictions, y))
            correct += (predictions == references).sum().item()
            total += references.numel()
        accelerator.print(f"epoch {epoch}: validation accuracy {correct / total:.4f}")

    accelerator.print(f"final validation accuracy: {correct / total:.4f}")
    accelerator.end_training()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mixed_precision", choices=["no", "fp16", "bf16"], default=None)
    parser.add_argument("--cpu", action="store_true", help="train on the CPU even if a GPU is present")
    parser.add_argument("--num_epochs", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=32, help="per process")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    training_function(args)


if __name__ == "__main__":
    main()
