"""Train a tiny Llama under DeepSpeed's Ulysses sequence parallelism (sp_size = processes) and, in the same process,
the same model plainly on whole sequences (the 1-process reference, no process group involved).

usage: hasten launch --num_processes 2 ds_ulysses.py OUT_DIR ZERO_STAGE

Same seed, same data, AdamW, gradient clipping at 1.0 in both. The labels of every sequence's first
tokens are -100 (an SFT prompt), so the two halves of a sequence count different numbers of tokens and the
loss across the group must weigh them. Each process writes OUT_DIR/rank{R}.json: the per-step losses of
both runs, the largest parameter difference after training, and what the loader handed out. The run saves
its state after step 2; a second Accelerator with a model from another seed loads it and trains steps 3-4
(its losses and final parameters are recorded beside the uninterrupted run's).
"""

import json
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM

from hasten import Accelerator
from hasten.parallelism_config import ParallelismConfig
from hasten.utils import DeepSpeedSequenceParallelConfig, set_seed
from hasten.utils.deepspeed import DeepSpeedPlugin
from hasten.state import AcceleratorState
from hasten.strategies.deepspeed.ulysses import sequence_parallel_loss

SEQ, SAMPLES, BATCH, PROMPT, LR, CLIP = 16, 8, 2, 5, 1e-3, 1.0


def make_model(seed: int = 0) -> LlamaForCausalLM:
    set_seed(seed)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM._from_config(config, attn_implementation="sdpa")


def samples() -> list[dict]:
    ids = torch.randint(0, 64, (SAMPLES, SEQ), generator=torch.Generator().manual_seed(7))
    labels = ids.clone()
    labels[:, :PROMPT] = -100
    return [{"input_ids": i, "labels": l, "position_ids": torch.arange(SEQ)} for i, l in zip(ids, labels)]


def reference() -> tuple[list[float], dict]:
    """One process, whole sequences, global batches in the order the sequence-parallel run takes them."""
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    losses = []
    for batch in DataLoader(samples(), batch_size=BATCH):
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, model.state_dict()


def build(stage: int, seed: int = 0):
    # The model comes first: built after a ZeRO-3 Accelerator, transformers would build it inside zero.Init (as under
    # Accelerate, which registers the config with transformers too), with other initial values than the reference's.
    model = make_model(seed)
    plugin = DeepSpeedPlugin(zero_stage=stage, gradient_clipping=CLIP)
    config = ParallelismConfig(sp_size=2, sp_handler=DeepSpeedSequenceParallelConfig(sp_attn_implementation="sdpa"))
    accelerator = Accelerator(cpu=True, deepspeed_plugin=plugin, parallelism_config=config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    loader = DataLoader(samples(), batch_size=BATCH)
    return (accelerator, *accelerator.prepare(model, optimizer, loader))


def step(accelerator, model, optimizer, batch) -> float:
    # transformers computes a loss only when `labels` is given; `shift_labels` (made before cutting) wins over it
    outputs = model(**batch, labels=batch["shift_labels"])
    loss = sequence_parallel_loss(outputs.loss, batch["shift_labels"])
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def resumed(out: Path, stage: int) -> tuple[list[float], dict]:
    """A fresh run (other initial weights) that loads the state saved after step 2 and trains steps 3-4."""
    accelerator, model, optimizer, loader = build(stage, seed=1)
    accelerator.load_state(str(out / "ckpt"))
    losses = [step(accelerator, model, optimizer, batch) for i, batch in enumerate(loader) if i >= 2]
    return losses, accelerator.get_state_dict(model)


def main(out: Path, stage: int) -> None:
    ref_losses, ref_state = reference()
    accelerator, model, optimizer, loader = build(stage)
    losses, shards = [], []
    for batch in loader:
        shards.append({"shape": list(batch["input_ids"].shape), "first_position": int(batch["position_ids"][0, 0]),
                       "contiguous": all(v.is_contiguous() for v in batch.values() if torch.is_tensor(v)),
                       "keys": sorted(batch)})
        losses.append(step(accelerator, model, optimizer, batch))
        if len(losses) == 2:
            accelerator.save_state(str(out / "ckpt"))
    state = accelerator.get_state_dict(model)  # gathered under ZeRO-3
    diff = max((state[k].float() - ref_state[k].float()).abs().max().item() for k in ref_state)
    second = accelerator.deepspeed_ulysses_dl_adapter(accelerator.prepare(DataLoader(samples(), batch_size=BATCH)), model)
    record = {"losses": losses, "ref_losses": ref_losses, "param_diff": diff, "shards": shards,
              "len": len(loader), "inner_len": len(loader.dl), "adapter": type(loader).__name__,
              "second_first_shape": list(next(iter(second))["input_ids"].shape),
              "mesh": accelerator.torch_device_mesh is None,
              "train_batch_size": accelerator.strategy.engine_config["train_batch_size"]}
    accelerator.free_memory()
    AcceleratorState._reset_state()  # the resumed run's Accelerator has a plugin of its own (as Accelerate asks)
    record["resumed_losses"], resumed_state = resumed(out, stage)
    record["resumed_bitwise"] = all(torch.equal(resumed_state[k], state[k]) for k in state)
    record["resumed_diff"] = max((resumed_state[k].float() - state[k].float()).abs().max().item() for k in state)
    (out / f"rank{accelerator.process_index}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
