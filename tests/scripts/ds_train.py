"""Train a small fp32 MLP plainly (1 process, global batch) or under DeepSpeed ZeRO (N processes, per-process batch).

usage:
  ds_train.py plain  OUT_DIR NAME:ACCUM ...          (no launcher: Accelerator without DeepSpeed, batch 16)
  ds_train.py zero   OUT_DIR NAME:STAGE:ACCUM ...    (hasten launch; STAGE "launch" takes the plugin from the launch flags)
                                                     (a config ckpt:STAGE:SAVE_AT runs uninterrupted, saving a checkpoint
                                                      after SAVE_AT micro-batches)
  ds_train.py resume OUT_DIR STAGE ...               (a new launch: load checkpoint_STAGE and finish the run)

Every run: same seed, same data, AdamW, a LambdaLR scheduler, clip_grad_norm_(1.0) (DeepSpeed clips by its
gradient_clipping=1.0). Final full parameters go to OUT_DIR/NAME.safetensors (main process), facts about each
process to OUT_DIR/NAME.rank{R}.json.
"""

import json
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, DataLoaderConfiguration, set_seed
from hasten.state import AcceleratorState
from hasten.utils.deepspeed import DeepSpeedPlugin
from hasten.scheduler import SchedulerKwargs

NUM_SAMPLES = 128
EPOCHS = 2
GLOBAL_BATCH = 16


def make_data() -> TensorDataset:
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(NUM_SAMPLES, 6, generator=generator)
    y = torch.sin(x @ torch.randn(6, 1, generator=generator)) + 0.1 * torch.randn(NUM_SAMPLES, 1, generator=generator)
    return TensorDataset(x, y)


def build(stage: str | None, accum: int, stateful: bool = False):
    set_seed(42)
    plugin = None if stage in (None, "launch") else DeepSpeedPlugin(zero_stage=int(stage), gradient_clipping=1.0)
    # the 1-process reference and the 2-process ZeRO run share one schedule: one step per optimizer step
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accum, deepspeed_plugin=plugin,
                              dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=stateful),
                              kwargs_handlers=[SchedulerKwargs(once_per_optimizer_step=True)])
    model = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 1))
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.9 ** step)
    batch = GLOBAL_BATCH // accelerator.num_processes
    loader = DataLoader(make_data(), batch_size=batch, shuffle=True,
                        generator=torch.Generator().manual_seed(0))  # the same global order on 1 and N processes
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    return accelerator, plugin, model, optimizer, loader, scheduler, init


def train_steps(accelerator, model, optimizer, loader, scheduler, info, stop_after=None, on_step=None):
    """Train to the end of EPOCHS (or `stop_after` micro-batches); returns the micro-batches done."""
    done = 0
    for _ in range(loader.epoch if hasattr(loader, "epoch") else 0, EPOCHS):
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                # (clip_grad_norm_ clips whenever called, as Accelerate's: once per optimizer step here)
                norm = accelerator.clip_grad_norm_(model.parameters(), 1.0) if accelerator.sync_gradients else None
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if norm is not None:
                info["norms"].append(float(norm))
            info["lrs"].append(optimizer.param_groups[0]["lr"])
            done += 1
            if on_step is not None:
                on_step(done)
            if stop_after is not None and done == stop_after:
                return done
    return done


def finish(accelerator, model, out_dir: Path, name: str, info: dict, init=None) -> None:
    full = accelerator.get_state_dict(model)
    info["state_dict_numel"] = sum(v.numel() for v in full.values())
    info["unwrapped_type"] = type(accelerator.unwrap_model(model)).__name__
    accelerator.save(full, out_dir / f"{name}.safetensors", safe_serialization=True)
    if init is not None:
        accelerator.save(init, out_dir / f"{name}.init.safetensors", safe_serialization=True)
    (out_dir / f"{name}.rank{accelerator.process_index}.json").write_text(json.dumps(info))
    accelerator.wait_for_everyone()


def zero_facts(accelerator, plugin, model, info: dict) -> None:
    state = accelerator.state
    info["distributed_type"] = state.distributed_type.value
    info["plugin_is_state_plugin"] = plugin is None or state.deepspeed_plugin is plugin
    info["zero_stage"] = state.deepspeed_plugin.zero_stage
    info["model_type"] = type(model).__name__
    params = list(accelerator.unwrap_model(model).parameters())
    info["local_numel"] = sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in params)
    info["full_numel"] = sum(int(p.ds_numel) if hasattr(p, "ds_numel") else p.numel() for p in params)
    info["num_params"] = len(params)
    info["micro_batch"] = model.train_micro_batch_size_per_gpu()  # the engine learnt it from the prepared loader


def main() -> None:
    mode, out_dir = sys.argv[1], Path(sys.argv[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    if mode in ("plain", "zero"):
        for config in sys.argv[3:]:
            parts = config.split(":")
            if parts[0] == "ckpt":  # ckpt:STAGE:SAVE_AT
                run_with_checkpoint(out_dir, parts[1], int(parts[2]))
                continue
            name, stage, accum = (parts[0], None, parts[1]) if mode == "plain" else parts
            accelerator, plugin, model, optimizer, loader, scheduler, init = build(stage, int(accum))
            info = {"norms": [], "lrs": []}
            if mode == "zero":
                zero_facts(accelerator, plugin, model, info)
            info["micro_batches"] = train_steps(accelerator, model, optimizer, loader, scheduler, info)
            finish(accelerator, model, out_dir, name, info, init)
            accelerator.free_memory()
            AcceleratorState._reset_state()  # a later Accelerator would share this one's plugin
    elif mode == "resume":
        for stage in sys.argv[3:]:
            accelerator, plugin, model, optimizer, loader, scheduler, _ = build(stage, 1, stateful=True)
            accelerator.load_state(str(out_dir / f"checkpoint_{stage}"))
            info = {"norms": [], "lrs": [], "resumed_lr": optimizer.param_groups[0]["lr"]}
            train_steps(accelerator, model, optimizer, loader, scheduler, info)
            finish(accelerator, model, out_dir, f"resumed_{stage}", info)
            accelerator.free_memory()
            AcceleratorState._reset_state()  # a later Accelerator would share this one's plugin
    from hasten.state import shutdown_process_group

    shutdown_process_group()


def run_with_checkpoint(out_dir: Path, stage: str, save_at: int) -> None:
    """An uninterrupted run that saves a checkpoint after `save_at` micro-batches (mid-epoch) and goes on."""
    accelerator, plugin, model, optimizer, loader, scheduler, _ = build(stage, 1, stateful=True)
    info = {"norms": [], "lrs": []}

    def save(done):
        if done == save_at:
            accelerator.save_state(str(out_dir / f"checkpoint_{stage}"))
            info["saved_lr"] = optimizer.param_groups[0]["lr"]

    train_steps(accelerator, model, optimizer, loader, scheduler, info, on_step=save)
    finish(accelerator, model, out_dir, f"uninterrupted_{stage}", info)
    accelerator.free_memory()
    AcceleratorState._reset_state()  # a later Accelerator would share this one's plugin


if __name__ == "__main__":
    main()
