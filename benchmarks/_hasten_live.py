"""hasten's side of benchmarks/recovery.py with live recovery: torchft's example's model and data, written the
Accelerate way (`hasten launch --num_machines 1:2 --elastic_recovery live` makes it elastic and live).

The same MLP and indexed synthetic samples as `_torchft_ddp.py`, AdamW, batches of 8 per process (MAX 2 processes:
16 samples an optimizer step, in the run's global order). STEP_SLEEP pauses before the backward, so that a kill lands
inside a step. Stops after STEPS committed optimizer steps and saves the flat parameters to $OUT/final_<machine>.pt.

Prints one line per optimizer step attempt: ``STEP <wall time> <pid> <optimizer steps> <committed> <processes>
<sample ids>``.
"""
import os
import time

T0 = time.time()
import torch

from hasten import Accelerator

STEPS = int(os.environ.get("STEPS", 90))
SLEEP = float(os.environ.get("STEP_SLEEP", 0.1))
print(f"START {T0:.3f} {os.getpid()}", flush=True)

torch.manual_seed(0)
N = 64 * 1000
data = torch.utils.data.TensorDataset(torch.arange(N), torch.randn(N, 16), torch.randn(N, 1))
accelerator = Accelerator(cpu=True)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
optimizer = torch.optim.AdamW(model.parameters())
loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
pending = []
for ids, x, y in loader:
    loss = torch.nn.functional.mse_loss(model(x), y)
    if accelerator.sync_gradients:
        time.sleep(SLEEP)  # (the benchmark's pause: before the step's last backward, so a kill lands inside a step)
    accelerator.backward(loss)
    pending += ids.tolist()
    ends_step = accelerator.sync_gradients
    optimizer.step()
    optimizer.zero_grad()
    if ends_step:  # one line per step attempt: committed, or dealt again (sync_gradients turned False)
        steps = accelerator.gradient_state.optimizer_steps
        print(f"STEP {time.time():.3f} {os.getpid()} {steps} {int(accelerator.sync_gradients)} "
              f"{accelerator._elastic.world} {','.join(map(str, pending))}", flush=True)
        pending = []
        if steps >= STEPS:
            break
flat = torch.cat([p.detach().flatten() for p in accelerator.unwrap_model(model).parameters()])
torch.save(flat, os.path.join(os.environ["OUT"], f"final_{os.environ.get('HASTEN_MACHINE', 'one').replace('/', '_')}.pt"))
