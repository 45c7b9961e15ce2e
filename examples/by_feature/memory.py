"""find_executable_batch_size: start big, take 90% of the batch size after each out-of-memory error, go on.

This is base.py plus the lines marked ``# New Code #``.
"""

import argparse

import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, set_seed
from hasten.utils import find_executable_batch_size


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
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
    set_seed(args.seed)

    # New Code #
    # everything that depends on the batch size lives in a function the decorator calls again,
    # with 90% of the batch size, after an out-of-memory error (free what the failed try held first)
    @find_executable_batch_size(starting_batch_size=args.batch_size)
    def inner_training_loop(batch_size):
        nonlocal accelerator
        accelerator.free_memory()
        accelerator.print(f"trying batch size {batch_size}")
        if batch_size > args.pretend_memory_for:  # stands in for a real out-of-memory error on a small device
            raise torch.OutOfMemoryError(f"pretend: a batch of {batch_size} does not fit")
        train_dl, eval_dl = get_dataloaders(batch_size)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        model, optimizer, train_dl, eval_dl = accelerator.prepare(model, optimizer, train_dl, eval_dl)
        return train(accelerator, args, model, optimizer, train_dl, eval_dl)

    inner_training_loop()


# New Code #
# the base loop, moved into a function so the batch-size search can call it
def train(accelerator, args, model, optimizer, train_dl, eval_dl):

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
    # New Code #
    parser.add_argument("--pretend_memory_for", type=int, default=10**9, help="batch sizes above fail as if out of memory")
    args = parser.parse_args()
    training_function(args)


if __name__ == "__main__":
    main()
