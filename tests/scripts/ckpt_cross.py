"""One training script for both libraries: train and save under one, load and continue under either.

usage: ckpt_cross.py LIBRARY PHASE OUT_DIR [--box] [--trust] [--layout]
  LIBRARY: accelerate | hasten (the only difference is the import line, as for a user switching)
  PHASE:   train (5 steps, then save_state(OUT_DIR/ckpt)) | continue (load_state(OUT_DIR/ckpt), 5 more steps)
  --box    register an object whose state holds a Python object (pickled, not weights_only-loadable)
  --trust  continue with load_state(..., load_kwargs={"weights_only": False})
  --layout train only: save with a save hook that writes the model in a subfolder (as diffusers does)
  --auto   continue only: automatic naming over OUT_DIR/project; load_state() finds the newest checkpoint_N

Each process writes OUT_DIR/<LIBRARY>_<PHASE>_rank<R>.json: per-step loss (float.hex) and lr, the files saved,
or the error load_state raised.
"""

import json
import os
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

library, phase, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
flags = set(sys.argv[4:])
if library == "accelerate":
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, set_seed
else:
    from hasten import Accelerator
    from hasten.utils import ProjectConfiguration, set_seed


class Counter:
    def __init__(self):
        self.steps = 0

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = state["steps"]


class Box:
    """Not a tensor, number or string: its pickle needs weights_only=False."""

    def __init__(self, value):
        self.value = value


class Boxed(Counter):
    def state_dict(self):
        return {"box": Box(self.steps)}

    def load_state_dict(self, state):
        self.steps = state["box"].value


set_seed(0)
project = ProjectConfiguration(str(out / "project"), automatic_checkpoint_naming=True) if "--auto" in flags else None
accelerator = Accelerator(cpu=True, project_config=project)
model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.7)
generator = torch.Generator().manual_seed(7)
x = torch.randn(160, 6, generator=generator)
data = TensorDataset(x, x.sum(dim=1, keepdim=True).sin())
loader = DataLoader(data, batch_size=8, shuffle=False)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
counter = Boxed() if "--box" in flags else Counter()
accelerator.register_for_checkpointing(counter)
if "--layout" in flags:
    def save_hook(models, weights, output_dir):
        if accelerator.is_main_process:
            for m in models:
                os.makedirs(os.path.join(output_dir, "net"), exist_ok=True)
                torch.save(accelerator.unwrap_model(m).state_dict(), os.path.join(output_dir, "net", "weights.pt"))
                weights.pop()

    accelerator.register_save_state_pre_hook(save_hook)

rank = accelerator.process_index
report = {"losses": [], "lr": []}
skip = 0
if phase == "continue":
    try:
        if "--auto" in flags:
            report["loaded"] = accelerator.load_state()
            report["save_iteration"] = accelerator.save_iteration
        elif "--trust" in flags:
            accelerator.load_state(str(out / "ckpt"), load_kwargs={"weights_only": False})
        else:
            accelerator.load_state(str(out / "ckpt"))
    except Exception as error:  # noqa: BLE001 - the test reads it
        report["error"] = f"{type(error).__name__}: {error}"
        (out / f"{library}_{phase}_rank{rank}.json").write_text(json.dumps(report))
        raise SystemExit(0)
    skip = counter.steps  # Accelerate's way: the loop skips what its own counter says was done
    report["restored_steps"] = counter.steps
batches = accelerator.skip_first_batches(loader, skip) if skip else loader
for step, (inputs, targets) in enumerate(batches):
    if step == 5:
        break
    model.train()
    loss = nn.functional.mse_loss(model(inputs), targets)
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    counter.steps += 1
    report["losses"].append(loss.item().hex())
    report["lr"].append(scheduler.get_last_lr()[0])
if phase == "train":
    accelerator.save_state(str(out / "ckpt"))
    accelerator.wait_for_everyone()
    report["files"] = sorted(os.listdir(out / "ckpt"))
    report["sub_files"] = {d: sorted(os.listdir(out / "ckpt" / d)) for d in report["files"] if (out / "ckpt" / d).is_dir()}
(out / f"{library}_{phase}_rank{rank}.json").write_text(json.dumps(report))
accelerator.end_training()
if library == "accelerate":
    # Accelerate's gloo group sometimes aborts the interpreter's teardown ("terminate called without an active
    # exception", seen in CI twice, with and without destroy_process_group). The report above is all the test
    # reads, and no collective follows it, so the peer leaves without the teardown. hasten's run exits normally.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
