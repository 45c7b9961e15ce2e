"""Train a small block model, sharded by FSDP2 (under `hasten launch`) or not (plain python, the reference).

Usage: fsdp_train.py OUT_DIR RUN [RUN ...], each RUN ``name:batch:accum:sync_each_batch:steps:variant[:action]``

`variant`: ``flags`` (the plugin `hasten launch --use_fsdp ...` decoded), or an
explicit plugin: ``ac`` (size-based wrap + activation checkpointing), ``full``
(FULL_STATE_DICT checkpoints), ``bf16`` (mixed precision), ``meta`` (the other
processes build the model on the meta device and receive the main process's weights), ``hsdp`` (a 2-D mesh:
2 replicas x WORLD_SIZE/2 shards), ``tp`` (WORLD_SIZE/2 shards x 2-way tensor parallel). Run without a
launcher, every variant trains unsharded: the 1-process reference.
`action`: ``save@K@DIR`` saves a checkpoint after K optimizer steps and goes
on; ``resume@DIR`` loads it and trains the remaining steps; ``midsave`` tries to
save between two optimizer steps and records the error; ``clipvalue`` clips by value
instead of by norm. Every run records the first step's gradient norms
(`clip_grad_norm_` with ``max_norm=inf``: 2, inf and 0), which measure without clipping.

The main process writes ``OUT_DIR/NAME.safetensors`` (the full state dict
from `get_state_dict`), every process ``OUT_DIR/NAME.rank<R>.json`` (losses,
the share of parameters it holds, what `accelerator.state` says).
"""

import json
import os
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, set_seed
from hasten.options import DataLoaderConfiguration, GradientAccumulationPlugin


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))


class Net(nn.Module):
    def __init__(self, width: int = 8, depth: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_data() -> TensorDataset:
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(256, 8, generator=generator)
    y = torch.sin(x.sum(dim=1, keepdim=True)) + 0.1 * torch.randn(256, 1, generator=generator)
    return TensorDataset(x, y)


def parallelism_for(variant: str):
    if "WORLD_SIZE" not in os.environ or variant not in ("hsdp", "tp"):
        return None
    from hasten import ParallelismConfig

    half = int(os.environ["WORLD_SIZE"]) // 2
    if variant == "tp":  # each Block's up-projection split by columns, down-projection by rows
        return ParallelismConfig(dp_shard_size=half, tp_size=2, tp_handler={"blocks.*.up": "colwise", "blocks.*.down": "rowwise"})
    return ParallelismConfig(dp_replicate_size=2, dp_shard_size=half)


def plugin_for(variant: str):
    if "WORLD_SIZE" not in os.environ or variant == "flags":
        return None  # the reference run, or whatever `hasten launch` decoded
    from hasten import FullyShardedDataParallelPlugin

    # FSDP2, as Accelerate's FSDP2 scripts ask for it (its plugin's defaults are FSDP1's, with no wrap units)
    fsdp2 = dict(fsdp_version=2, cpu_ram_efficient_loading=True)
    if variant == "ac":
        return FullyShardedDataParallelPlugin(auto_wrap_policy="SIZE_BASED_WRAP", min_num_params=100,
                                              activation_checkpointing=True, **fsdp2)
    by_block = dict(auto_wrap_policy="TRANSFORMER_BASED_WRAP", transformer_cls_names_to_wrap=["Block"], **fsdp2)
    if variant == "full":
        return FullyShardedDataParallelPlugin(state_dict_type="FULL_STATE_DICT", **by_block)
    return FullyShardedDataParallelPlugin(**by_block)


def run(out: Path, name: str, batch: int, accum: int, sync_each: bool, steps: int, variant: str, action: str) -> None:
    set_seed(42)
    plugin = GradientAccumulationPlugin(num_steps=accum, sync_each_batch=sync_each)
    accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=plugin, fsdp_plugin=plugin_for(variant),
                              parallelism_config=parallelism_for(variant),
                              mixed_precision="bf16" if variant == "bf16" else "no",
                              dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    if variant == "meta" and accelerator.process_index != 0:  # only the main process holds real weights
        with torch.device("meta"):
            model = Net()
    else:
        model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)  # built before prepare on purpose
    loader = DataLoader(make_data(), batch_size=batch, shuffle=True,
                        generator=torch.Generator().manual_seed(0))  # the same global order on 1 and N processes
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())
    total = sum(p.numel() for p in model.parameters())
    done, error = 0, None
    if action.startswith("resume@"):
        directory = Path(action.split("@", 1)[1])
        accelerator.load_state(str(directory))
        done = int(json.loads((directory / "steps.json").read_text())["done"])
    losses, norms = [], None
    while done < steps:
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                if accelerator.sync_gradients and norms is None:  # max_norm=inf measures, never clips (1.16)
                    norms = [accelerator.clip_grad_norm_(model.parameters(), float("inf"), norm_type=kind).item()
                             for kind in (2.0, float("inf"), 0.0)]
                if accelerator.sync_gradients and action == "clipvalue":
                    accelerator.clip_grad_value_(model.parameters(), 0.05)  # under FSDP2 too, as in Accelerate 1.16
                elif accelerator.sync_gradients:  # (clip_grad_norm_ clips whenever called, as Accelerate's)
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
            losses.append(accelerator.reduce(loss.detach().float(), "mean").item())
            if action == "midsave" and error is None and not accelerator.sync_gradients:
                try:
                    accelerator.save_state(str(out / f"{name}.midsave"))
                    error = ""
                except Exception as failure:  # noqa: BLE001 - recorded for the test
                    error = f"{type(failure).__name__}: {failure}"
            if accelerator.sync_gradients:
                done += 1
                if action.startswith("save@") and done == int(action.split("@")[1]):
                    directory = Path(action.split("@", 2)[2])
                    accelerator.save_state(str(directory))
                    if accelerator.is_main_process:
                        (directory / "steps.json").write_text(json.dumps({"done": done}))
                    accelerator.wait_for_everyone()
                if done == steps:
                    break
    state = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        accelerator.save({k: v.float().contiguous() for k, v in state.items()}, out / f"{name}.safetensors",
                         safe_serialization=True)
    info = {"losses": losses, "norms": norms, "local_params": local, "total_params": total, "state_keys": len(state), "error": error,
            "distributed_type": accelerator.state.distributed_type.value,
            "fsdp_plugin": type(accelerator.state.fsdp_plugin).__name__,
            "mesh": list(getattr(accelerator.strategy, "mesh", None).mesh_dim_names or ()) if variant in ("hsdp", "tp") else None}
    (out / f"{name}.rank{accelerator.process_index}.json").write_text(json.dumps(info))
    accelerator.wait_for_everyone()


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for spec in sys.argv[2:]:
        name, batch, accum, sync_each, steps, variant, *action = spec.split(":", 6)
        run(out, name, int(batch), int(accum), sync_each == "1", int(steps), variant, action[0] if action else "")


if __name__ == "__main__":
    main()
