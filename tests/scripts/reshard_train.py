"""Save mid-epoch on one number of processes, resume on another: every engine, the same guarantee as DDP.

usage: reshard_train.py OUT_DIR ENGINE:PHASE ...
  ENGINE ddp | fsdp (SHARDED_STATE_DICT) | fsdpfull (FULL_STATE_DICT) | z1 | z2 | z3 (DeepSpeed ZeRO stage)
         | ddpmid (DDP accumulating 2 batches, saved after 3: in the middle of a cycle)
  PHASE  save          train 2 global batches of 6 samples, save_state(OUT_DIR/ENGINE/ckpt), finish the epoch
         resume:B      load_state(OUT_DIR/ENGINE/ckpt) with B samples per process, finish the epoch (files named
                       resume<N>, N the number of processes)
         refuse:B      load_state with B samples per process, where the position does not divide: record the
                       error (refuse<N>.rank<R>.json)

Each sample carries its index. Every process writes OUT_DIR/ENGINE/PHASE.rank<R>.json with the indices it trained
on (before the save, or after the load); the main process writes, as safetensors, the full (gathered) parameters
and optimizer state right before the save or right after the load (`PHASE.state.safetensors`) and at the end
of the epoch (`PHASE.final.safetensors`).
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, DataLoaderConfiguration, set_seed
from hasten.state import AcceleratorState

SAMPLES, GLOBAL_BATCH, SAVE_AFTER = 36, 6, 2  # 6 global batches in the epoch, the checkpoint after 2 of them


def plugins(engine: str) -> dict:
    if engine.startswith("fsdp"):
        from hasten import FullyShardedDataParallelPlugin

        kind = "FULL_STATE_DICT" if engine == "fsdpfull" else "SHARDED_STATE_DICT"
        return {"fsdp_plugin": FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type=kind)}
    if engine.startswith("z"):
        from hasten.utils.deepspeed import DeepSpeedPlugin

        return {"deepspeed_plugin": DeepSpeedPlugin(zero_stage=int(engine[1:]))}
    return {}


def full_state(accelerator, engine: str, model, optimizer) -> dict[str, torch.Tensor]:
    """Parameters and optimizer state, gathered whole (every process calls it; the main process keeps it)."""
    state = {}
    if engine.startswith("z"):
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

        for name, param in accelerator.unwrap_model(model).named_parameters():
            state[f"param.{name}"] = safe_get_full_fp32_param(param).reshape(param.ds_shape if hasattr(param, "ds_shape")
                                                                              else param.shape)
            for key in ("exp_avg", "exp_avg_sq"):
                state[f"{key}.{name}"] = safe_get_full_optimizer_state(param, key).reshape(state[f"param.{name}"].shape)
        return {k: v.detach().cpu().clone() for k, v in state.items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    for name, value in accelerator.get_state_dict(model).items():
        state[f"param.{name}"] = value
    inner = getattr(optimizer, "optimizer", optimizer)
    if engine.startswith("fsdp"):
        saved = get_optimizer_state_dict(model, inner, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        per_param = saved.get("state", {})
    else:
        names = [n for n, _ in accelerator.unwrap_model(model).named_parameters()]
        per_param = {names[i]: v for i, v in inner.state_dict()["state"].items()}
    for name, values in per_param.items():
        for key, value in values.items():
            state[f"{key}.{name}"] = value.reshape(1) if value.dim() == 0 else value
    return {k: v.detach().cpu().clone().contiguous() for k, v in state.items()}


def main() -> None:
    out = Path(sys.argv[1])
    for item in sys.argv[2:]:
        engine, phase = item.split(":", 1)
        run(out / engine, phase, engine)
    from hasten.state import shutdown_process_group

    shutdown_process_group()


def run(out: Path, phase: str, engine: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    set_seed(0)
    accumulation = 2 if engine == "ddpmid" else 1
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True),
                              gradient_accumulation_steps=accumulation, **plugins(engine))
    world, rank = accelerator.num_processes, accelerator.process_index
    batch = GLOBAL_BATCH // world if phase == "save" else int(phase.split(":")[1])
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, 5, generator=generator)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True).sin(), torch.arange(SAMPLES))
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 1))  # sizes that 2 and 3 do not divide evenly
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    # "ddpplain": a plain shuffled loader, no generator (one process draws its shuffle from torch's global RNG,
    # several from the generator prepare seeds): the saved order is carried to any number of processes
    seeded = {} if engine == "ddpplain" else {"generator": torch.Generator().manual_seed(5)}
    loader = DataLoader(data, batch_size=batch, shuffle=True, **seeded)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    name = "save" if phase == "save" else f"{phase.split(':')[0]}{world}"
    if name != "save":
        try:
            accelerator.load_state(str(out / "ckpt"))
        except Exception as error:  # noqa: BLE001 - the refusal is what the test reads
            (out / f"{name}.rank{rank}.json").write_text(json.dumps({"error": f"{type(error).__name__}: {error}"}))
            accelerator.free_memory()
            AcceleratorState._reset_state()  # the next engine's Accelerator would share this one's DeepSpeed plugin
            return
        loaded = full_state(accelerator, engine, model, optimizer)
        if accelerator.is_main_process:
            save_file(loaded, str(out / f"{name}.state.safetensors"))
    seen, steps = [], 0
    for inputs, targets, index in loader:
        with accelerator.accumulate(model):
            loss = nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        seen += index.tolist()
        steps += 1
        if name == "save" and steps == SAVE_AFTER + accumulation - 1:
            saved = full_state(accelerator, engine, model, optimizer)
            if accelerator.is_main_process:
                save_file(saved, str(out / "save.state.safetensors"))
            accelerator.save_state(str(out / "ckpt"))
            (out / f"save.rank{rank}.json").write_text(json.dumps({"seen": seen, "world": world}))
    final = full_state(accelerator, engine, model, optimizer)
    if accelerator.is_main_process:
        save_file(final, str(out / f"{name}.final.safetensors"))
    if name != "save":
        (out / f"{name}.rank{rank}.json").write_text(json.dumps({"seen": seen, "world": world}))
    accelerator.wait_for_everyone()
    accelerator.free_memory()
    AcceleratorState._reset_state()  # the next engine's Accelerator would share this one's DeepSpeed plugin


if __name__ == "__main__":
    main()
