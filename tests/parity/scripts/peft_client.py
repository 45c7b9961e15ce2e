"""A LoRA fine-tune (PEFT) of a tiny causal LM through transformers' `Trainer`: no line of Accelerate here.

transformers and PEFT import Accelerate themselves; under hasten the same
file runs with ``hasten launch --as-accelerate``. Offline: the model, the
tokenizer and the texts are made in `tiny_lm`. LoRA (rank 4, dropout 0.1)
sits on the attention's q/v projections; gradient accumulation 2.

Every rank appends JSON lines to ``OUT/records_rank<R>.jsonl``: per
micro-batch the rows it trained on and its exact loss (``float.hex``), per
optimizer step the learning rate, on the main process what Trainer logs.
The main process then saves the adapter (``model.save_pretrained(OUT/adapter)``),
loads it back onto a fresh base model (``PeftModel.from_pretrained``) and
writes how the loaded weights and logits compare with the trained ones
(``k: "adapter"``, with each LoRA tensor's sum as ``float.hex``); then
``{"k": "done"}``.

Run it::

    python peft_client.py --out OUT
    accelerate launch --multi_gpu --num_processes 2 peft_client.py --out OUT
    hasten launch --as-accelerate --num_processes 2 peft_client.py --out OUT

Example:
    >>> parse_args(["--out", "o"]).gradient_accumulation_steps
    2
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

import torch
from datasets import Dataset
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments, set_seed
from transformers.utils import logging as hf_logging

from tiny_lm import Recorder, build_model, build_tokenizer, done, record_writer, recording, texts


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="LoRA on a tiny causal LM with transformers' Trainer")
    parser.add_argument("--out", required=True, help="where the per-step records and the adapter go")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--per_device_train_batch_size", type=int, default=4)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    parser.add_argument("--num_train_epochs", type=float, default=2)
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args(argv)


def lora_model(tokenizer, seed):
    set_seed(seed)  # the base weights and LoRA's A matrices are drawn from the global RNG
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    return get_peft_model(build_model(tokenizer), config)


def check_adapter(write, trained, tokenizer, args, batch):
    """Save the adapter, load it onto a fresh base, and write how the two compare."""
    folder = os.path.join(args.out, "adapter")
    trained.save_pretrained(folder)
    set_seed(args.seed)
    loaded = PeftModel.from_pretrained(build_model(tokenizer), folder)
    mine, theirs = trained.state_dict(), loaded.state_dict()
    lora = sorted(name for name in mine if "lora_" in name)
    diff = max(float((mine[name] - theirs[name]).abs().max()) for name in mine)
    trained.eval(), loaded.eval()
    with torch.no_grad():
        logits_diff = float((trained(**batch).logits - loaded(**batch).logits).abs().max())
    write(k="adapter", files=sorted(os.listdir(folder)), same_keys=sorted(mine) == sorted(theirs), tensors=len(mine),
          lora=len(lora), max_abs_diff=diff, logits_max_abs_diff=logits_diff,
          lora_sums={name: float(mine[name].double().sum()).hex() for name in lora})


def main():
    args = parse_args()
    rank, write = record_writer(args.out)
    if rank != 0:
        hf_logging.set_verbosity_error()
    corpus = texts(args.rows)
    tokenizer = build_tokenizer(corpus)
    dataset = Dataset.from_dict({"text": [line + " " + tokenizer.eos_token for line in corpus]})
    dataset = dataset.map(lambda batch: tokenizer(batch["text"]), batched=True, remove_columns=["text"])
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    training_args = TrainingArguments(
        output_dir=args.out, use_cpu=True, seed=args.seed, report_to=[], logging_steps=1, save_strategy="no",
        per_device_train_batch_size=args.per_device_train_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps, num_train_epochs=args.num_train_epochs,
        learning_rate=1e-2, warmup_steps=2, lr_scheduler_type="cosine", disable_tqdm=True, dataloader_num_workers=0)
    model = lora_model(tokenizer, args.seed)
    trainer = recording(Trainer, write, tokenizer)(model=model, args=training_args, train_dataset=dataset,
                                                   data_collator=collator, callbacks=[Recorder(write)])
    trainer.train()
    if trainer.is_world_process_zero():
        check_adapter(write, trainer.model, tokenizer, args, collator([dataset[i] for i in range(4)]))
    done(write, trainer)
    torch.distributed.destroy_process_group() if torch.distributed.is_initialized() else None


if __name__ == "__main__":
    main()
