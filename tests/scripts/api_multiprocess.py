"""Multi-process parts of the peer API surface: LocalSGD, join_uneven_inputs, triggers, trigger_sync_in_backward, DDP comm hooks.

Each rank writes rank{N}.json into argv[1]; tests/test_api_surface.py compares the ranks.
"""

import json
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from hasten import Accelerator, DistributedDataParallelKwargs
from hasten.local_sgd import LocalSGD

out = Path(sys.argv[1])
accelerator = Accelerator(cpu=True)
rank = accelerator.process_index
result = {}


def params(model):
    return [round(v, 6) for p in accelerator.unwrap_model(model).parameters() for v in p.detach().flatten().tolist()]


def grads(model):
    return [round(v, 6) for p in accelerator.unwrap_model(model).parameters() for v in p.grad.flatten().tolist()]


# -- LocalSGD: no all-reduce inside; parameters averaged every local_sgd_steps steps ------------------
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
data = torch.Generator().manual_seed(100 + rank)  # different data on each rank
steps = []
with LocalSGD(accelerator, model, local_sgd_steps=2) as local_sgd:
    for _ in range(4):
        x = torch.randn(8, 4, generator=data)
        accelerator.backward(model(x).pow(2).mean())
        step_grads = grads(model)
        optimizer.step()
        optimizer.zero_grad()
        local_sgd.step()
        steps.append({"params": params(model), "grads": step_grads})
result["local_sgd"] = steps

# -- triggers: one rank raises the flag, every rank sees it once ------------------------------------------
if rank == 1:
    accelerator.set_trigger()
result["triggers"] = [accelerator.check_trigger(), accelerator.check_trigger()]

# -- trigger_sync_in_backward: gradients synchronised even inside no_sync ---------------------------------
torch.manual_seed(0)
sync_model = accelerator.prepare(torch.nn.Linear(4, 1))
x = torch.randn(4, 4, generator=data)
with accelerator.no_sync(sync_model):
    sync_model(x).sum().backward()
result["no_sync_grads"] = grads(sync_model)
sync_model.zero_grad()
with accelerator.no_sync(sync_model):
    with accelerator.trigger_sync_in_backward(sync_model):
        sync_model(x).sum().backward()
result["triggered_grads"] = grads(sync_model)

# -- join_uneven_inputs: ranks with different batch counts train without hanging ---------------------------
torch.manual_seed(0)
join_model = torch.nn.Linear(1, 1)
join_optimizer = torch.optim.SGD(join_model.parameters(), lr=0.01)
loader = DataLoader(torch.arange(5, dtype=torch.float32).unsqueeze(1), batch_size=1)
join_model, join_optimizer, loader = accelerator.prepare(join_model, join_optimizer, loader)
batches = 0
with accelerator.join_uneven_inputs([join_model], even_batches=False):
    for batch in loader:
        accelerator.backward(join_model(batch).sum())
        join_optimizer.step()
        join_optimizer.zero_grad()
        batches += 1
result["join_batches"] = batches
result["join_even_batches_restored"] = loader.batch_sampler.even_batches
result["join_params"] = params(join_model)

# -- DDP communication hook (fp16 compression), registered on the wrapped model ----------------------------
hooked = Accelerator(cpu=True, kwargs_handlers=[DistributedDataParallelKwargs(comm_hook="fp16")])
torch.manual_seed(0)
hook_model = hooked.prepare(torch.nn.Linear(4, 1))
hook_model(torch.randn(4, 4, generator=data)).sum().backward()
result["comm_hook"] = hook_model._get_ddp_logging_data().get("comm_hook")
result["hook_grads"] = grads(hook_model)

(out / f"rank{rank}.json").write_text(json.dumps(result))
accelerator.end_training()
