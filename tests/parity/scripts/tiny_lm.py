"""What the TRL and PEFT clients share: texts, a word-level tokenizer and a tiny Llama, all made here (offline).

Each text starts with its own word ``sN``, so every sequence names its row
(`rows_of`). No line of Accelerate here either.

Example:
    >>> len(texts(8)), texts(8)[3].split()[0]
    (8, 's3')
    >>> tokenizer = build_tokenizer(texts(8))
    >>> rows_of(tokenizer, [tokenizer.convert_tokens_to_ids("s5")])
    [5]
"""

from __future__ import annotations

import json
import os

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, TrainerCallback

SPECIALS = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]
SUBJECTS = ["the cat", "a dog", "my friend", "the robot", "our teacher", "a bird", "the child", "an old man"]
VERBS = ["sees", "likes", "finds", "paints", "follows", "carries"]
OBJECTS = ["a red ball", "the big tree", "some bread", "a small boat", "the river", "two stones", "the moon"]


def texts(n: int) -> list[str]:
    """``n`` short sentences, row ``i`` starting with the word ``s<i>`` (varied lengths: padding matters)."""
    rows = []
    for i in range(n):
        words = [f"s{i}", SUBJECTS[i % len(SUBJECTS)], VERBS[(3 * i) % len(VERBS)], OBJECTS[(5 * i) % len(OBJECTS)]]
        words += ["and", OBJECTS[(i + 2) % len(OBJECTS)]] * (i % 3)
        rows.append(" ".join(words))
    return rows


def build_tokenizer(corpus: list[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``corpus``'s words, with pad / unk / bos / eos tokens."""
    vocab = {token: i for i, token in enumerate(SPECIALS)}
    for word in sorted({w for line in corpus for w in line.split()}):
        vocab[word] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", bos_token="[BOS]",
                                   eos_token="[EOS]")


def build_model(tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    """A 2-layer Llama with hidden size 32 over ``tokenizer``'s vocabulary (weights from the global RNG)."""
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def rows_of(tokenizer: PreTrainedTokenizerFast, first_tokens: list[int]) -> list[int]:
    """The row numbers of sequences whose first tokens are ``first_tokens`` (``sN`` -> N)."""
    return [int(tokenizer.convert_ids_to_tokens(token)[1:]) for token in first_tokens]


def record_writer(out: str):
    """``(rank, write)``: ``write(**fields)`` appends one JSON line to ``out/records_rank<R>.jsonl``."""
    rank = int(os.environ.get("RANK", "0"))
    os.makedirs(out, exist_ok=True)
    records = open(os.path.join(out, f"records_rank{rank}.jsonl"), "a")

    def write(**fields):
        records.write(json.dumps(fields) + "\n")
        records.flush()

    return rank, write


def hexed(values: dict) -> dict:
    """``values`` with its floats as ``float.hex`` (compared bit for bit)."""
    return {key: (float(value).hex() if isinstance(value, float) else value) for key, value in (values or {}).items()}


class Recorder(TrainerCallback):
    """Writes the learning rate after each optimizer step and what Trainer logs."""

    def __init__(self, write):
        self.write = write

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.write(k="log", step=state.global_step, **hexed(logs))

    def on_step_end(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        self.write(k="step", step=state.global_step, lr=float(optimizer.param_groups[0]["lr"]).hex(),
                   sched_lr=float(lr_scheduler.get_last_lr()[0]).hex())


def recording(trainer_class, write, tokenizer):
    """``trainer_class`` that also writes each micro-batch's rows and exact loss (Trainer's logs round it)."""

    class RecordingTrainer(trainer_class):
        def training_step(self, model, inputs, num_items_in_batch=None):
            rows = rows_of(tokenizer, inputs["input_ids"][:, 0].tolist())  # right padding: the first token is sN
            loss = super().training_step(model, inputs, num_items_in_batch)
            write(k="micro", rows=rows, tokens=int(inputs["attention_mask"].sum()), loss=float(loss).hex())
            return loss

    return RecordingTrainer


def done(write, trainer) -> None:
    """The last record: which library ran it, on how many processes, around which model."""
    write(k="done", world=trainer.args.world_size, accelerate=type(trainer.accelerator).__module__,
          distributed=str(trainer.accelerator.distributed_type), wrapped=type(trainer.model_wrapped).__name__)
