"""Mocked data loaders for Accelerate's example scripts (``TESTING_MOCKED_DATALOADERS=1``).

Like Accelerate's, they read the small MRPC sample files of a checkout of
Accelerate's repository (``tests/test_samples/MRPC/{train,dev}.csv``,
relative to the working directory) and tokenize them with the model the
example names; they need `datasets` and `transformers`.

Example:
    >>> from hasten.test_utils.training import mocked_dataloaders
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

__all__ = ["MRPC_FILES", "mocked_dataloaders", "mocked_dataloaders_for_autoregressive_models"]

MRPC_FILES = {"train": "tests/test_samples/MRPC/train.csv", "validation": "tests/test_samples/MRPC/dev.csv"}


def _mrpc() -> Any:
    from datasets import load_dataset

    return load_dataset("csv", data_files=MRPC_FILES)


def _pad_multiple(accelerator: Any) -> int | None:
    """Round lengths for mixed precision kernels: 16 under fp8, 8 under fp16/bf16."""
    if accelerator.mixed_precision == "fp8":
        return 16
    return None if accelerator.mixed_precision == "no" else 8


def mocked_dataloaders(accelerator: Any, batch_size: int = 16) -> tuple[DataLoader, DataLoader]:
    """Sentence-pair train / validation loaders (batches of 2 and 1) tokenized with ``bert-base-cased``.

    Example:
        >>> callable(mocked_dataloaders)
        True
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained("bert-base-cased")
    raw = _mrpc()
    labels = {label: index for index, label in enumerate(raw["train"].unique("label"))}

    def encode(rows: dict[str, list[Any]]) -> Any:
        encoded = tokenizer(rows["sentence1"], rows["sentence2"], truncation=True, max_length=None, padding="max_length")
        if "label" in rows:
            encoded["labels"] = [labels[label] for label in rows["label"]]
        return encoded

    data = raw.map(encode, batched=True, remove_columns=["sentence1", "sentence2", "label"])

    def collate(rows: list[dict[str, Any]]) -> Any:
        return tokenizer.pad(rows, padding="longest", return_tensors="pt")

    return (DataLoader(data["train"], shuffle=True, collate_fn=collate, batch_size=2),
            DataLoader(data["validation"], shuffle=False, collate_fn=collate, batch_size=1))


def mocked_dataloaders_for_autoregressive_models(accelerator: Any, batch_size: int = 16) -> tuple[DataLoader, DataLoader]:
    """Causal-LM train / validation loaders of the first sentences, tokenized with ``HuggingFaceTB/SmolLM-360M``.

    Example:
        >>> callable(mocked_dataloaders_for_autoregressive_models)
        True
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained("HuggingFaceTB/SmolLM-360M")
    tokenizer.pad_token = tokenizer.eos_token
    raw = _mrpc()
    with accelerator.main_process_first():
        data = raw.map(lambda rows: tokenizer(rows["sentence1"], truncation=True, max_length=None,
                                             return_attention_mask=False),
                       batched=True, remove_columns=["sentence1", "sentence2", "label"])

    def collate(rows: list[dict[str, Any]]) -> Any:
        import torch

        longest = max(len(row["input_ids"]) for row in rows)
        batch = tokenizer.pad(rows, padding="max_length", max_length=longest,
                              pad_to_multiple_of=_pad_multiple(accelerator), return_tensors="pt")
        # as Accelerate 1.16: the labels are the inputs (a causal LM shifts them itself), padding ignored by the loss
        batch["labels"] = torch.where(batch["input_ids"] == tokenizer.pad_token_id, -100, batch["input_ids"])
        return batch

    return (DataLoader(data["train"], shuffle=False, collate_fn=collate, batch_size=2),
            DataLoader(data["validation"], shuffle=False, collate_fn=collate, batch_size=1))
