"""A live run's training script, written the Accelerate way (tests/test_live.py starts it as each "machine").

Nothing in the loop is live-specific: the launch spec (HASTEN_LAUNCH_SPEC) makes the run elastic (MAX 2) and live.
Prints one line per step attempt: ``STEP <time> <pid> <optimizer steps> <committed 0/1> <P> <sample ids> <lr>``; at the
end ``DONE <optimizer steps> <lr>``, and saves the flat parameters to $OUT/final_<pid>.pt (ENGINE=fsdp: FSDP2 in each
machine's group; the machine's main process saves them). STEP_SLEEP pauses before
each step's synchronising backward (where the test's kill lands: inside a step); with PACE_FILE, the pause is read from
that file at each step (a test slows the survivors while a machine rejoins, so a loaded machine's join still lands
before the run ends, and speeds them up once it is over). With PROJECT, periodic checkpoints
(every SAVE_EVERY optimizer steps) go there, and the run resumes from the newest one at its start.
"""

import os
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, DataLoaderConfiguration, FullyShardedDataParallelPlugin, ProjectConfiguration
from hasten.utils import set_seed

OUT = os.environ["OUT"]
SLEEP = float(os.environ.get("STEP_SLEEP", "0"))
PACE_FILE = os.environ.get("PACE_FILE")


def pause() -> float:
    """The pause before this step's synchronising backward (PACE_FILE's number when there is one)."""
    if PACE_FILE:
        try:
            with open(PACE_FILE) as handle:
                return float(handle.read() or SLEEP)
        except (OSError, ValueError):
            pass
    return SLEEP


def say(line: str) -> None:
    """One write per line: a machine's processes share the launcher's output, and a line must not be split."""
    sys.stdout.flush()
    os.write(1, (line + "\n").encode())


say(f"START {time.time():.3f} {os.getpid()}")

set_seed(0)
PROJECT = os.environ.get("PROJECT")  # periodic checkpoints there, every SAVE_EVERY optimizer steps; resumed at start
project = ProjectConfiguration(PROJECT, automatic_checkpoint_naming=True,
                               save_every_n_steps=int(os.environ["SAVE_EVERY"])) if PROJECT else None
# ENGINE=fsdp: FSDP2 in each machine's group (sharded within a machine, replicated across machines)
engine = {"fsdp_plugin": FullyShardedDataParallelPlugin(fsdp_version=2)} if os.environ.get("ENGINE") == "fsdp" else {}
accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2, project_config=project,
                          dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=bool(PROJECT)), **engine)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + 0.05 * s))
generator = torch.Generator().manual_seed(1)
N = int(os.environ.get("SAMPLES", "2048"))
data = TensorDataset(torch.arange(N), torch.randn(N, 16, generator=generator), torch.randn(N, 1, generator=generator))
loader = DataLoader(data, batch_size=8, shuffle=True)
model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, loader)
if PROJECT:
    accelerator.load_state()  # the newest complete checkpoint, if there is one

pending = []
for ids, x, y in loader:
    with accelerator.accumulate(model):
        loss = torch.nn.functional.mse_loss(model(x), y)
        if accelerator.sync_gradients and pause():
            time.sleep(pause())  # (the test's pause: its kill lands inside a step)
        accelerator.backward(loss)
        pending += ids.tolist()
        sync = accelerator.sync_gradients
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    if sync:
        committed = int(accelerator.sync_gradients)
        processes = accelerator._elastic.world
        say(f"STEP {time.time():.3f} {os.getpid()} {accelerator.gradient_state.optimizer_steps} {committed} "
              f"{processes} {','.join(map(str, pending))} {scheduler.get_last_lr()[0]!r}")
        pending = []

state = accelerator.get_state_dict(model)  # (whole, from the shards under FSDP2: on the machine's main process)
if state:
    flat = torch.cat([value.detach().flatten() for value in state.values()])
    torch.save(flat, os.path.join(OUT, f"final_{os.getpid()}.pt"))
say(f"DONE {accelerator.gradient_state.optimizer_steps} {scheduler.get_last_lr()[0]:.8f}")
