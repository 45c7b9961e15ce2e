"""One process under Accelerate's DeepSpeed path or hasten's (the switch): the step losses, as float hex.

usage: ds_peer_pair.py LIB SCENARIO     (LIB: accelerate | hasten; the environment holds RANK=0, WORLD_SIZE=1, ...)
  pair:PRECISION  a student (ZeRO-2) trained beside a teacher (ZeRO-3, forward only) under named plugins
  fp8:STAGE       fp8 (torchao, emulated, no float8 all-gather) on a ZeRO-STAGE engine

Written for Accelerate: Accelerate runs no autocast under DeepSpeed, so the inputs are cast to the engine's dtype
here (hasten's autocast then changes nothing). Accelerate's DeepSpeed path runs on a CPU with one process only.
"""

import os
import sys

if sys.argv[1] == "hasten":
    import hasten.as_accelerate  # noqa: F401  (every accelerate import below is hasten)

import torch

from accelerate import Accelerator, DeepSpeedPlugin
from accelerate.utils import AORecipeKwargs, set_seed


def config(stage: int) -> dict:
    return {"zero_optimization": {"stage": stage}, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
            "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}, "gradient_clipping": 1.0}


def batches():
    return torch.utils.data.DataLoader(torch.randn(48, 32, generator=torch.Generator().manual_seed(3)), batch_size=4)


def pair(precision: str) -> None:
    named = {"student": DeepSpeedPlugin(hf_ds_config=config(2)), "teacher": DeepSpeedPlugin(hf_ds_config=config(3))}
    accelerator = Accelerator(deepspeed_plugins=named, mixed_precision=precision)
    set_seed(0)
    student = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    teacher = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)).requires_grad_(False)
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-2)
    student, optimizer, loader = accelerator.prepare(student, optimizer, batches())
    accelerator.state.select_deepspeed_plugin("teacher")
    teacher = accelerator.prepare(teacher)
    accelerator.state.select_deepspeed_plugin("student")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    for x in loader:
        x = x.to(dtype)
        with torch.no_grad():
            target = teacher(x).float()
        loss = (student(x).float() - target).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        print("LOSS", loss.item().hex(), flush=True)


def fp8(stage: int) -> None:
    from torchao.float8 import Float8LinearConfig

    recipe = AORecipeKwargs(config=Float8LinearConfig(emulate=True, enable_fsdp_float8_all_gather=False))
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config(stage)), mixed_precision="fp8",
                              kwargs_handlers=[recipe])
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 16))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, batches())
    print("LAYERS", [type(m).__name__ for m in model.module], accelerator.mixed_precision, flush=True)
    for x in loader:
        loss = model(x.bfloat16()).float().pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        print("LOSS", loss.item().hex(), flush=True)


if __name__ == "__main__":
    kind, value = sys.argv[2].split(":")
    pair(value) if kind == "pair" else fp8(int(value))
    # Run directly (not launched), either library's process meets the interpreter's C++ teardown with a gloo group
    # alive: now and then a still-joinable thread aborts it after every line is printed ("terminate called without
    # an active exception", seen once for hasten's run in a full suite). The test reads the printed lines only, so the
    # script leaves as hasten's launched ranks do (hasten.process.exit.exit_cleanly), for both libraries alike.
    sys.stdout.flush()
    os._exit(0)
