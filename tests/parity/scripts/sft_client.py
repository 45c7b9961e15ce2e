"""Supervised fine-tuning of a tiny causal LM with TRL's `SFTTrainer`: no line of Accelerate here.

TRL and transformers import Accelerate themselves; under hasten the same
file runs with ``hasten launch --as-accelerate``. Nothing is downloaded: the
model is a 2-layer Llama built from a config, the tokenizer a word-level one
built over the texts, the data sentences made in `tiny_lm`. SFTConfig's
defaults stand (bf16 mixed precision, TRL's own fused-loss forward).

Every rank appends JSON lines to ``OUT/records_rank<R>.jsonl``: per
micro-batch the rows it trained on and its exact loss (``float.hex``), per
optimizer step the learning rate, on the main process what Trainer logs;
then ``{"k": "done"}``.

Run it::

    python sft_client.py --out OUT
    accelerate launch --multi_gpu --num_processes 2 sft_client.py --out OUT
    hasten launch --as-accelerate --num_processes 2 sft_client.py --out OUT

Example:
    >>> parse_args(["--out", "o"]).rows
    32
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

import torch
from datasets import Dataset
from transformers import set_seed
from transformers.utils import logging as hf_logging
from trl import SFTConfig, SFTTrainer

from tiny_lm import Recorder, build_model, build_tokenizer, done, record_writer, recording, texts


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="tiny causal LM with TRL's SFTTrainer")
    parser.add_argument("--out", required=True, help="where the per-step records go")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--per_device_train_batch_size", type=int, default=4)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--num_train_epochs", type=float, default=2)
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args(argv)


def main():
    args = parse_args()
    rank, write = record_writer(args.out)
    if rank != 0:
        hf_logging.set_verbosity_error()
    corpus = texts(args.rows)
    tokenizer = build_tokenizer(corpus)
    config = SFTConfig(
        output_dir=args.out, use_cpu=True, seed=args.seed, report_to=[], logging_steps=1, save_strategy="no",
        per_device_train_batch_size=args.per_device_train_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps, num_train_epochs=args.num_train_epochs,
        learning_rate=1e-3, warmup_steps=2, lr_scheduler_type="linear", max_length=32, disable_tqdm=True,
        dataloader_num_workers=0)
    set_seed(args.seed)  # before the model: its weights are drawn from the global RNG
    model = build_model(tokenizer)
    trainer = recording(SFTTrainer, write, tokenizer)(
        model=model, args=config, train_dataset=Dataset.from_dict({"text": corpus}), processing_class=tokenizer,
        callbacks=[Recorder(write)])
    trainer.train()
    done(write, trainer)
    torch.distributed.destroy_process_group() if torch.distributed.is_initialized() else None


if __name__ == "__main__":
    main()
