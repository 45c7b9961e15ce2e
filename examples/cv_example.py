"""Train a small CNN on scikit-learn's handwritten digits with hasten, on 1 or N processes.

What it shows: one ordinary PyTorch training loop that runs unchanged on one
process or on several (CPU or GPU), in full or mixed precision:

- ``Accelerator(...)`` reads the launcher's settings (processes, precision,
  gradient accumulation); command-line flags given here override them;
- ``accelerator.prepare(...)`` shards the data loaders across processes,
  wraps the model for gradient synchronisation (DDP) and under autocast,
  and wraps the optimizer and the LR scheduler;
- ``accelerator.accumulate(model)`` + ``accelerator.backward(loss)`` +
  ``accelerator.clip_grad_norm_`` for gradient accumulation, fp16 loss
  scaling and clipping without any ``if`` in the loop;
- ``accelerator.gather_for_metrics`` for an exact validation accuracy: the
  gathered predictions add up to exactly ``len(eval_dataset)`` samples, even
  though the last batch was padded so every process steps equally often;
- ``accelerator.save(accelerator.unwrap_model(model).state_dict(), ...)``
  writes ``model.safetensors`` once, from the main process;
- with ``--project_dir DIR``: a checkpoint after every epoch
  (``DIR/checkpoints/checkpoint_<n>``, the last 2 kept) and one line,
  ``accelerator.load_state()``, that resumes the run exactly after a crash,
  a ``--max_restarts`` restart or a preemption (SIGTERM / SIGUSR1: the run
  saves at the next batch and exits 75; start it again to continue).

The data are the 1,797 real 8x8 grey-scale digit images bundled with
scikit-learn (``sklearn.datasets.load_digits``; nothing is downloaded), split
80/20 into 1,437 training and 360 validation images, stratified by class,
with a fixed split seed so every run validates on the same 360 images.

Run it on one process::

    python examples/cv_example.py

or on two processes of this machine (``--batch_size`` is per process, so the
global batch is 2 x batch_size)::

    hasten launch --num_processes 2 examples/cv_example.py
    hasten launch --num_processes 2 --mixed_precision bf16 examples/cv_example.py

It prints the validation accuracy after every epoch and, at the end, a line
``final validation accuracy: 0.9xxx (360 samples)``. It exits with status 1
if that accuracy is below 0.95, so it doubles as an end-to-end check.
It takes well under a minute on a 2-core CPU (about 5-10 s of training).

On a CPU prefer ``--mixed_precision bf16`` to ``fp16``: it works, but on CPUs
without native half-precision support PyTorch's float16 convolutions are
about 30x slower than float32 (minutes instead of seconds). fp16 is meant
for GPUs.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm

from hasten import Accelerator, DataLoaderConfiguration, ProjectConfiguration, ThroughputMeter, set_seed
from hasten.logging import get_logger
from hasten.tracking import available_trackers

logger = get_logger(__name__)  # records print once (main process), not once per process

SPLIT_SEED = 0  # fixed: the validation set is the same whatever --seed is
MIN_ACCURACY = 0.95  # below this the script exits with status 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=16, help="passes over the training set (default: 16)")
    parser.add_argument("--batch_size", type=int, default=32, help="training batch size per process (default: 32)")
    parser.add_argument(
        "--lr", type=float, default=3e-3, help="peak learning rate of the one-cycle schedule (default: 3e-3)"
    )
    parser.add_argument(
        "--mixed_precision",
        choices=["no", "fp16", "bf16"],
        default=None,
        help="mixed precision (default: what `hasten launch` was given, else 'no')",
    )
    parser.add_argument(
        "--gradient_accumulation_steps",
        type=int,
        default=None,
        help="batches per optimizer step (default: what `hasten launch` was given, else 1)",
    )
    parser.add_argument("--seed", type=int, default=42, help="seed for model init, shuffling and dropout (default: 42)")
    parser.add_argument("--output_dir", default=None, help="if given, save model.safetensors there at the end")
    parser.add_argument("--logging_dir", default="runs/cv_example", help="where the metrics are written")
    parser.add_argument("--project_dir", default=None,
                        help="if given, checkpoint every epoch under DIR/checkpoints and resume from the newest one")
    parser.add_argument("--cpu", action="store_true", help="train on the CPU even if a GPU is present")
    return parser.parse_args(argv)


class DigitsCNN(nn.Module):
    """A small CNN for 1x8x8 images: two conv blocks, then a classifier head."""

    def __init__(self, width: int = 32, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, width, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # 8x8 -> 4x4
            nn.Conv2d(width, 2 * width, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # 4x4 -> 2x2
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Dropout(0.25),
            nn.Linear(2 * width * 2 * 2, 128),
            nn.ReLU(inplace=True),
            nn.Linear(128, num_classes),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images))


def make_datasets() -> tuple[TensorDataset, TensorDataset]:
    """The digits as (N, 1, 8, 8) float images, standardised with the training set's statistics."""
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1)  # pixel values 0..16
    labels = torch.tensor(digits.target, dtype=torch.long)
    train_idx, eval_idx = train_test_split(
        torch.arange(len(labels)).numpy(), test_size=0.2, stratify=labels.numpy(), random_state=SPLIT_SEED
    )
    train_x, eval_x = images[train_idx], images[eval_idx]
    mean, std = train_x.mean(), train_x.std()
    train_x, eval_x = (train_x - mean) / std, (eval_x - mean) / std
    return TensorDataset(train_x, labels[train_idx]), TensorDataset(eval_x, labels[eval_idx])


def evaluate(accelerator: Accelerator, model: nn.Module, eval_dl: DataLoader) -> tuple[float, int]:
    """Accuracy over the whole validation set, and the number of samples it was computed on."""
    model.eval()
    correct, seen = 0, 0
    with torch.no_grad():
        for images, labels in eval_dl:
            predictions = model(images).argmax(dim=-1)
            # All processes' predictions, minus the samples repeated to pad the last batch.
            predictions, labels = accelerator.gather_for_metrics((predictions, labels))
            correct += (predictions == labels).sum().item()
            seen += labels.numel()
    model.train()
    return correct / seen, seen


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    logging.basicConfig(format="%(message)s", level=logging.INFO)

    # Checkpoints only with --project_dir (keep the 2 newest; resume inside an interrupted epoch);
    # metrics always: TensorBoard when it is installed, JSON lines otherwise.
    checkpointing = args.project_dir is not None
    project = ProjectConfiguration(args.project_dir, logging_dir=args.logging_dir,
                                   automatic_checkpoint_naming=checkpointing, total_limit=2)
    accelerator = Accelerator(
        cpu=True if args.cpu else None,  # None: whatever the launcher said
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        project_config=project,
        dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True),
        log_with="tensorboard" if "tensorboard" in available_trackers() else "jsonl",
    )
    set_seed(args.seed)  # same seed on every process: identical initial weights

    train_ds, eval_ds = make_datasets()
    train_dl = DataLoader(
        train_ds, batch_size=args.batch_size, shuffle=True, generator=torch.Generator().manual_seed(args.seed)
    )
    eval_dl = DataLoader(eval_ds, batch_size=2 * args.batch_size, shuffle=False)

    model = DigitsCNN()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)

    # hasten steps the scheduler once per real optimizer step, so size it in
    # optimizer steps as one process sees them: each process gets
    # ceil(len(train_ds) / global_batch) batches per epoch (len(train_dl)
    # after prepare) and steps the optimizer every `accumulation` batches
    # plus once at the epoch's last batch, hence the second ceil.
    accumulation = accelerator.gradient_accumulation_steps
    global_batch = args.batch_size * accelerator.num_processes
    batches_per_process = math.ceil(len(train_ds) / global_batch)
    steps_per_epoch = math.ceil(batches_per_process / accumulation)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=args.lr, total_steps=args.epochs * steps_per_epoch, pct_start=0.25
    )

    model, optimizer, train_dl, eval_dl, scheduler = accelerator.prepare(
        model, optimizer, train_dl, eval_dl, scheduler
    )
    assert len(train_dl) == batches_per_process  # the sharded loader: this process's batches

    accelerator.print(
        f"{accelerator.num_processes} process(es) on {accelerator.device}, "
        f"mixed_precision={accelerator.mixed_precision}, "
        f"gradient_accumulation_steps={accumulation}"
    )
    accelerator.print(
        f"train: {len(train_ds)} images, {len(train_dl)} batches of {args.batch_size} per process "
        f"(global batch {global_batch * accumulation} per optimizer step); validation: {len(eval_ds)} images"
    )

    accelerator.init_trackers("cv_example", config=vars(args))
    meter = ThroughputMeter(world_size=accelerator.num_processes)
    if checkpointing:
        accelerator.load_state()  # the newest complete checkpoint, if any: model, optimizer, data position, RNG

    accuracy, seen = 0.0, 0
    for epoch in range(train_dl.epoch, args.epochs):  # train_dl.epoch: where a resumed run stopped
        train_dl.set_epoch(epoch)
        model.train()
        loss_sum = torch.zeros((), device=accelerator.device)
        progress = tqdm(
            train_dl,
            desc=f"epoch {epoch + 1}/{args.epochs}",
            disable=not accelerator.is_local_main_process,
            leave=False,
            dynamic_ncols=True,
        )
        for images, labels in progress:
            with accelerator.accumulate(model):
                logits = model(images)  # under autocast when mixed precision is on
                loss = F.cross_entropy(logits.float(), labels)
                accelerator.backward(loss)
                accelerator.clip_grad_norm_(model.parameters(), max_norm=1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            loss_sum += loss.detach()
            meter.step(samples=len(labels))
            if progress.n % 5 == 0:
                progress.set_postfix(samples_per_sec=f"{meter.compute().get('samples_per_sec', 0):.0f}", refresh=False)
        train_loss = accelerator.reduce(loss_sum / len(train_dl), reduction="mean").item()

        accuracy, seen = evaluate(accelerator, model, eval_dl)
        logger.info(
            f"epoch {epoch + 1:2d}/{args.epochs}: train loss {train_loss:.4f}, "
            f"validation accuracy {accuracy:.4f} ({seen} samples), lr {scheduler.get_last_lr()[0]:.2e}"
        )
        accelerator.log({"train_loss": train_loss, "val_accuracy": accuracy, "lr": scheduler.get_last_lr()[0],
                         **meter.compute()}, step=epoch)
        if checkpointing:
            accelerator.save_state()

    if seen == 0:  # resumed after the last epoch: nothing left to train
        accuracy, seen = evaluate(accelerator, model, eval_dl)

    if seen != len(eval_ds):  # gather_for_metrics must count every validation image exactly once
        raise RuntimeError(f"validation counted {seen} samples, expected {len(eval_ds)}")

    if args.output_dir is not None:
        accelerator.wait_for_everyone()
        path = os.path.join(args.output_dir, "model.safetensors")
        accelerator.save(accelerator.unwrap_model(model).state_dict(), path, safe_serialization=True)  # main only
        accelerator.print(f"saved {path}")

    elapsed = time.perf_counter() - started
    accelerator.print(f"final validation accuracy: {accuracy:.4f} ({seen} samples) in {elapsed:.1f}s")
    accelerator.end_training()
    if accuracy < MIN_ACCURACY:
        accelerator.print(f"FAILED: validation accuracy {accuracy:.4f} < {MIN_ACCURACY}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
