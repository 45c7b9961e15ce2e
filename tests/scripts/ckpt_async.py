"""Train a few steps, saving each step twice: synchronously into OUT/sync/step_K and asynchronously into OUT/async/step_K.

Usage: ckpt_async.py OUT [--end-right-after]

The asynchronous save is taken right after the synchronous one, before the
next step changes anything, so both folders must hold the same bytes. The
training thread goes on (next step) while the asynchronous save writes.
With --end-right-after the script returns right after its last asynchronous
save, without waiting: the end of the run must wait for it.
Writes OUT/rank{R}.json with the async handles' types, each save's time, and the bytes of the copy buffers the
process kept from its previous asynchronous save (only a process that writes the parameters needs them).
"""

import json
import sys
import time
from pathlib import Path

import torch

from hasten import Accelerator
from hasten.checkpointing import snapshot
from hasten.utils import set_seed

out = Path(sys.argv[1])
end_right_after = "--end-right-after" in sys.argv
set_seed(0)
accelerator = Accelerator(cpu=True)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
data = torch.utils.data.TensorDataset(torch.randn(64, 64), torch.randn(64, 1))
loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
report = {"sync_s": [], "async_s": [], "is_str": True, "copy_buffer_bytes": []}
handles = []
for step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    start = time.perf_counter()
    accelerator.save_state(out / "sync" / f"step_{step}")
    report["sync_s"].append(time.perf_counter() - start)
    # (the synchronous save waited for the previous asynchronous one: its buffers are back in the pool)
    report["copy_buffer_bytes"].append(sum(b.nbytes() for kept in snapshot._pool.values() for b in kept))
    start = time.perf_counter()
    handle = accelerator.save_state(out / "async" / f"step_{step}", async_save=True)
    report["async_s"].append(time.perf_counter() - start)
    report["is_str"] = report["is_str"] and isinstance(handle, str) and handle == str(out / "async" / f"step_{step}")
    handles.append(handle)
    if step == 3:
        break
if not end_right_after:
    for handle in handles:
        handle.wait()
(out / f"rank{accelerator.process_index}.json").write_text(json.dumps(report))
