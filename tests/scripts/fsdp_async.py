"""FSDP2 (SHARDED_STATE_DICT, or FULL_STATE_DICT with --full): save_state synchronously into OUT/sync and with async_save=True into OUT/async, take an
optimizer step right after the asynchronous call, then load each checkpoint back.

Usage: fsdp_async.py OUT [--full]

The main process writes OUT/state.{saved,stepped,async,sync}.safetensors: the gathered parameters and AdamW state at
the save, after the step taken while the asynchronous save wrote, and after loading OUT/async and OUT/sync. Every
process writes OUT/rank{R}.json with whether the handle was a str and its path.
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

from hasten import Accelerator, FullyShardedDataParallelPlugin, set_seed


def full_state(accelerator, model, optimizer) -> dict[str, torch.Tensor]:
    """Parameters and optimizer state, gathered whole (collective; the main process keeps them)."""
    state = {f"param.{k}": v for k, v in accelerator.get_state_dict(model).items()}
    inner = getattr(optimizer, "optimizer", optimizer)
    saved = get_optimizer_state_dict(model, inner, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    for name, values in saved.get("state", {}).items():
        for key, value in values.items():
            state[f"{key}.{name}"] = value.reshape(1) if value.dim() == 0 else value
    return {k: v.detach().cpu().clone().contiguous() for k, v in state.items()}


def step(accelerator, model, optimizer) -> None:
    x = torch.randn(4, 16)
    accelerator.backward(model(x).pow(2).mean())
    optimizer.step()
    optimizer.zero_grad()


def main() -> None:
    out = Path(sys.argv[1])
    set_seed(0)
    kind = "FULL_STATE_DICT" if "--full" in sys.argv else "SHARDED_STATE_DICT"
    accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(state_dict_type=kind))
    model = nn.Sequential(nn.Linear(16, 33), nn.Tanh(), nn.Linear(33, 3))  # 33: not divisible by 2 processes
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(2):
        step(accelerator, model, optimizer)
    states = {"saved": full_state(accelerator, model, optimizer)}
    accelerator.save_state(str(out / "sync"))
    handle = accelerator.save_state(str(out / "async"), async_save=True)
    step(accelerator, model, optimizer)  # while the shards are written: must not reach them
    states["stepped"] = full_state(accelerator, model, optimizer)
    handle.wait()
    for name in ("async", "sync"):
        accelerator.load_state(str(out / name))
        states[name] = full_state(accelerator, model, optimizer)
    if accelerator.is_main_process:
        for name, state in states.items():
            save_file(state, str(out / f"state.{name}.safetensors"))
    report = {"is_str": isinstance(handle, str), "path": str(handle)}
    (out / f"rank{accelerator.process_index}.json").write_text(json.dumps(report))
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
