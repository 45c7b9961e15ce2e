"""An ordinary training script that does what an automatic restart needs, run elastically as is.

usage: elastic_train.py OUT_DIR ENGINE [STEP_SECONDS [EPOCHS [ACCUMULATION [MAX_PROCESSES [SAVE_INSIDE]]]]]
  ENGINE  ddp | fsdp (FSDP2, sharded checkpoints) | z2 (DeepSpeed ZeRO-2) | launched (the engine and the
          accumulation come from the launch: e.g. --use_deepspeed --deepspeed_config_file FILE, whose
          gradient_accumulation_steps is the recipe's)
  STEP_SECONDS  a pause after each micro-batch (the file OUT_DIR/pace, when a test writes one, overrides it:
                tests slow a phase down so that a machine's return or a signal lands in the middle of the run)
  ACCUMULATION  the script's gradient_accumulation_steps (default 1)
  MAX_PROCESSES the processes of the run's recipe (the uninterrupted run's), which size the LR schedule (default 2)
  SAVE_INSIDE   N: once (the first run only), after the second micro-batch following optimizer step N, call
                save_state() inside the accumulation cycle and stop there (a script's own save, at any moment)

It resumes with `load_state()` at the start and saves through hasten's periodic checkpoints (every 2 optimizer
steps, in the background); nothing in it knows about elasticity. Each sample carries its index. After every
optimizer step each process appends one JSON line to OUT_DIR/steps.rank<R>.pid<PID>.jsonl: the optimizer step
(counted by a registered object, so it survives a resume), the group's size, the accumulation, the learning rate
and the indices this process trained on in that step; after each micro-batch that does not end a step, one line
to OUT_DIR/micro.rank<R>.jsonl (so a test can send a signal inside an accumulation cycle). The main process writes
the final parameters to
OUT_DIR/final.safetensors, and (ENGINE ddp) logs each step's loss to TensorBoard under OUT_DIR/project/elastic.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, DataLoaderConfiguration, ProjectConfiguration, set_seed

SAMPLES, BATCH = 96, 4  # 24 batches an epoch (at 2 processes, accumulation 1: 12 optimizer steps)


class StepCount:
    """The script's own count of optimizer steps, checkpointed with everything else."""

    def __init__(self) -> None:
        self.done = 0

    def state_dict(self) -> dict:
        return {"done": self.done}

    def load_state_dict(self, state: dict) -> None:
        self.done = int(state["done"])


def _pace(out: Path, default: float) -> float:
    try:
        return float((out / "pace").read_text())
    except (OSError, ValueError):
        return default


def plugins(engine: str) -> dict:
    if engine == "fsdp":
        from hasten import FullyShardedDataParallelPlugin

        return {"fsdp_plugin": FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")}
    if engine == "z2":
        from hasten.utils.deepspeed import DeepSpeedPlugin

        # a clipping norm never reached (DeepSpeed clips to 1.0 by default, and a plugin's 0 means that default, as
        # in Accelerate): ZeRO-2 then trains DDP's numbers, and the test compares every engine's run with one
        # uninterrupted DDP run of its recipe
        return {"deepspeed_plugin": DeepSpeedPlugin(zero_stage=2, gradient_clipping=1e6)}
    return {}


def main() -> None:
    out, engine = Path(sys.argv[1]), sys.argv[2]
    pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    epochs = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    accumulation = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    processes = int(sys.argv[6]) if len(sys.argv) > 6 else 2
    save_inside = int(sys.argv[7]) if len(sys.argv) > 7 else None
    set_seed(0)
    accelerator = Accelerator(
        cpu=True, gradient_accumulation_steps=None if engine == "launched" else accumulation,
        dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True),
        project_config=ProjectConfiguration(str(out / "project"), automatic_checkpoint_naming=True, total_limit=3,
                                            save_every_n_steps=2),
        log_with="tensorboard" if engine == "ddp" else None, **plugins(engine))
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, 6, generator=generator)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True).sin(), torch.arange(SAMPLES))
    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    total = epochs * -(-SAMPLES // (BATCH * processes * accumulation))  # optimizer steps of the run's recipe
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 - s / (total * processes + 1))
    loader = DataLoader(data, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(5))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    count = StepCount()
    accelerator.register_for_checkpointing(count)
    if engine == "ddp":
        accelerator.init_trackers("elastic")
    accelerator.load_state()  # the newest complete checkpoint, at whatever size the group has now
    log = out / f"steps.rank{accelerator.process_index}.pid{os.getpid()}.jsonl"
    micro = out / f"micro.rank{accelerator.process_index}.jsonl"
    seen: list[int] = []
    in_cycle = 0  # micro-batches since the last optimizer step
    start_epoch = loader.epoch if hasattr(loader, "epoch") else 0
    for _ in range(start_epoch, epochs):
        for inputs, targets, index in loader:
            if save_inside is not None and count.done == save_inside and in_cycle == 2 and \
                    not (out / "saved_inside").exists():
                accelerator.save_state()
                accelerator.wait_for_everyone()
                if accelerator.is_main_process:
                    (out / "saved_inside").write_text(str(count.done))
                accelerator.end_training()
                return
            with accelerator.accumulate(model):
                loss = nn.functional.mse_loss(model(inputs), targets)
                accelerator.backward(loss)
                seen += index.tolist()
                lr = scheduler.get_last_lr()[0]
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if not accelerator.sync_gradients:
                with micro.open("a") as file:
                    file.write(json.dumps({"step": count.done, "world": accelerator.num_processes,
                                           "time": time.time()}) + "\n")
            time.sleep(_pace(out, pause))
            in_cycle = 0 if accelerator.sync_gradients else in_cycle + 1
            if accelerator.sync_gradients:
                count.done += 1
                accelerator.log({"loss": loss.item()}, step=count.done)
                with log.open("a") as file:
                    file.write(json.dumps({"step": count.done, "world": accelerator.num_processes,
                                           "accumulation": accelerator.gradient_accumulation_steps, "lr": lr,
                                           "loss": loss.item(), "seen": seen, "time": time.time()}) + "\n")
                seen = []
    state = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        save_file({k: v.contiguous() for k, v in state.items()}, str(out / "final.safetensors"))
    accelerator.end_training()


if __name__ == "__main__":
    main()
