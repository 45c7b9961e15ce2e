"""Several DeepSpeed models in one run (Accelerate's named `deepspeed_plugins`), and fp8 on a DeepSpeed engine.

usage (hasten launch --num_processes 2):  ds_multi.py OUT_DIR CONFIG ...
  pair       a student (ZeRO-2, trained) beside a frozen teacher (ZeRO-3, forward only) under named plugins;
             saves a checkpoint of both after SAVE_AT steps and trains on to the end
  alone      the same student under one ZeRO-2 plugin, trained against the plain (unprepared) teacher's outputs
  resume     (a new launch) the pair rebuilt, `load_state` of pair's checkpoint, trained on to the end
  two        two trained models, ZeRO-2 and ZeRO-3, one Accelerator each sharing the named plugins (Accelerate's
             second-Accelerator pattern); also a plain torch reference of the same training, on every process
  fp8:STAGE  fp8 (torchao, emulated) on a ZeRO-STAGE bf16 engine

Each config writes OUT_DIR/NAME.safetensors (final full weights, main process) and OUT_DIR/NAME.rank{R}.json.
"""

import json
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, DataLoaderConfiguration, set_seed
from hasten.state import AcceleratorState
from hasten.utils.deepspeed import DeepSpeedPlugin, get_active_deepspeed_plugin

NUM_SAMPLES, BATCH, SAVE_AT, LR = 96, 4, 5, 1e-2  # 12 steps of a global batch of 8 on 2 processes
TEACHER_SEED = 7


def data() -> TensorDataset:
    generator = torch.Generator().manual_seed(1234)
    return TensorDataset(torch.randn(NUM_SAMPLES, 16, generator=generator))


def student() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))


def teacher() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    return model.requires_grad_(False)


def plugins() -> dict:
    return {"student": DeepSpeedPlugin(zero_stage=2), "teacher": DeepSpeedPlugin(zero_stage=3)}


def loader() -> DataLoader:
    return DataLoader(data(), batch_size=BATCH, shuffle=False)


def build_pair(teacher_seed: int):
    """The pair under named plugins; the student first (the active plugin), then the teacher under its own."""
    named = plugins()
    accelerator = Accelerator(deepspeed_plugins=named, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    set_seed(42)
    net = student()
    set_seed(teacher_seed)
    frozen = teacher()
    optimizer = torch.optim.AdamW(net.parameters(), lr=LR)
    net, optimizer, batches = accelerator.prepare(net, optimizer, loader())
    facts = {"first_active": get_active_deepspeed_plugin(accelerator.state) is named["student"]}
    accelerator.state.select_deepspeed_plugin("teacher")
    facts["teacher_active"] = accelerator.deepspeed_plugin is named["teacher"] and named["teacher"].selected
    frozen = accelerator.prepare(frozen)
    accelerator.state.select_deepspeed_plugin("student")
    params = list(frozen.module.parameters())
    facts["teacher_local_numel"] = sum(p.ds_tensor.numel() for p in params)
    facts["teacher_full_numel"] = sum(int(p.ds_numel) for p in params)
    facts["teacher_type"] = type(frozen).__name__
    return accelerator, net, optimizer, batches, frozen, facts


def distill(accelerator, net, optimizer, batches, frozen, losses, on_step=None, start=0):
    for step, (x,) in enumerate(batches, start=start + 1):
        with accelerator.accumulate(net):
            with torch.no_grad():
                target = frozen(x)
            loss = torch.nn.functional.mse_loss(net(x), target)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(loss.item())
        if on_step is not None:
            on_step(step)


def finish(accelerator, model, out: Path, name: str, facts: dict, extra=None) -> None:
    weights = accelerator.get_state_dict(model)
    accelerator.save(weights, out / f"{name}.safetensors", safe_serialization=True)
    if extra is not None:
        for suffix, other in extra.items():
            accelerator.save(accelerator.get_state_dict(other), out / f"{name}.{suffix}.safetensors", safe_serialization=True)
    (out / f"{name}.rank{accelerator.process_index}.json").write_text(json.dumps(facts))
    accelerator.wait_for_everyone()
    accelerator.free_memory()
    AcceleratorState._reset_state()  # named plugins are shared by later Accelerators of the process (as in Accelerate)


def run_pair(out: Path) -> None:
    accelerator, net, optimizer, batches, frozen, facts = build_pair(TEACHER_SEED)
    losses: list[float] = []

    def save(step):
        if step == SAVE_AT:
            facts["checkpoint"] = accelerator.save_state(str(out / "checkpoint_pair"))

    distill(accelerator, net, optimizer, batches, frozen, losses, on_step=save)
    facts["losses"] = losses
    finish(accelerator, net, out, "pair", facts, extra={"teacher": frozen})


def run_resume(out: Path) -> None:
    accelerator, net, optimizer, batches, frozen, facts = build_pair(TEACHER_SEED + 1)  # load_state must restore it
    accelerator.load_state(str(out / "checkpoint_pair"))
    losses: list[float] = []
    distill(accelerator, net, optimizer, batches, frozen, losses, start=SAVE_AT)
    facts["losses"] = losses
    finish(accelerator, net, out, "resume", facts, extra={"teacher": frozen})


def run_alone(out: Path) -> None:
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    set_seed(42)
    net = student()
    set_seed(TEACHER_SEED)
    frozen = teacher()  # a plain module: its outputs without DeepSpeed
    optimizer = torch.optim.AdamW(net.parameters(), lr=LR)
    net, optimizer, batches = accelerator.prepare(net, optimizer, loader())
    losses: list[float] = []
    distill(accelerator, net, optimizer, batches, frozen, losses)
    finish(accelerator, net, out, "alone", {"losses": losses}, extra={"teacher": frozen})


def run_two(out: Path) -> None:
    named = plugins()
    first = Accelerator(deepspeed_plugins=named)
    second = Accelerator()  # shares the named plugins, as in Accelerate
    facts = {"second_is_deepspeed": second.distributed_type.value == "DEEPSPEED",
             "second_shares": second.state.deepspeed_plugins is named}
    set_seed(42)
    a = student()
    b = student()
    b.load_state_dict(a.state_dict())
    init = {k: v.clone() for k, v in a.state_dict().items()}
    opt_a, opt_b = torch.optim.AdamW(a.parameters(), lr=LR), torch.optim.AdamW(b.parameters(), lr=LR)
    a, opt_a, batches = first.prepare(a, opt_a, loader())
    second.state.select_deepspeed_plugin("teacher")  # the ZeRO-3 plugin trains the second model
    b, opt_b = second.prepare(b, opt_b)
    facts["b_partitioned"] = all(hasattr(p, "ds_tensor") for p in b.module.parameters())
    target = torch.nn.Linear(16, 8)
    torch.nn.init.constant_(target.weight, 0.05)
    for (x,) in batches:
        with first.accumulate(a, b):
            for accelerator, model, opt in ((first, a, opt_a), (second, b, opt_b)):
                loss = torch.nn.functional.mse_loss(model(x), target(x).detach())
                accelerator.backward(loss)
                opt.step()
                opt.zero_grad()
    # the same training in plain torch: one process, the global batch (2 x BATCH), AdamW
    plain = student()
    plain.load_state_dict(init)
    opt = torch.optim.AdamW(plain.parameters(), lr=LR)
    for (x,) in DataLoader(data(), batch_size=2 * BATCH, shuffle=False):
        torch.nn.functional.mse_loss(plain(x), target(x).detach()).backward()
        opt.step()
        opt.zero_grad()
    if first.is_main_process:
        first.save(plain.state_dict(), out / "two.plain.safetensors", safe_serialization=True)
    weights_b = second.get_state_dict(b)
    if second.is_main_process:
        second.save(weights_b, out / "two.b.safetensors", safe_serialization=True)
    finish(first, a, out, "two", facts)


def run_fp8(out: Path, stage: int) -> None:
    from torchao.float8 import Float8LinearConfig

    from hasten.utils import AORecipeKwargs

    recipe = AORecipeKwargs(config=Float8LinearConfig(emulate=True))
    accelerator = Accelerator(mixed_precision="fp8", deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage),
                              kwargs_handlers=[recipe])
    set_seed(42)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                              torch.nn.Linear(32, 16))
    optimizer = torch.optim.AdamW(net.parameters(), lr=LR)
    net, optimizer, batches = accelerator.prepare(net, optimizer, loader())
    config = net.config if isinstance(getattr(net, "config", None), dict) else {}
    facts = {"layers": [type(m).__name__ for m in net.module], "mixed_precision": accelerator.mixed_precision,
             "bf16_engine": bool(net.bfloat16_enabled()), "stage": net.zero_optimization_stage(),
             "weight_dtype": str(next(net.module.parameters()).dtype), "config_bf16": config.get("bf16")}
    losses = []
    for _ in range(3):
        for (x,) in batches:
            loss = torch.nn.functional.mse_loss(net(x).float(), x)  # fp32 inputs: the forward runs under bf16 autocast
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    facts["losses"] = losses
    finish(accelerator, net, out, f"fp8_{stage}", facts)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for config in sys.argv[2:]:
        if config.startswith("fp8:"):
            run_fp8(out, int(config.split(":")[1]))
        else:
            {"pair": run_pair, "alone": run_alone, "resume": run_resume, "two": run_two}[config](out)
    from hasten.state import shutdown_process_group

    shutdown_process_group()


if __name__ == "__main__":
    main()
