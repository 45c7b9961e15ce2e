"""The sections of `gpu_check.py` that run under torchrun (distributed), and the peer parity script.

Each is Python source run in a child process; each prints ``RESULT {json}``
as its last word. Kept apart from the runner so each file stays short.
"""

from gpu_check_common import COMMON

CODE: dict[str, str] = {}

# Under torchrun. On a machine with one GPU the section runs as 1 rank in a NCCL group of its own (NCCL refuses
# two ranks on one GPU), so FSDP2's and ZeRO's collectives still go through NCCL on the GPU.
ONE_RANK_GROUP = """
import os, torch.distributed as dist
if DEV == "cuda" and int(os.environ.get("WORLD_SIZE", "1")) == 1:
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
"""

CODE["nccl"] = COMMON + """
import os
from hasten import Accelerator
import torch.distributed as dist
accelerator = Accelerator()
t = torch.arange(4.0, device=accelerator.device) + accelerator.process_index
gathered = accelerator.gather(t); reduced = accelerator.reduce(t, "sum"); padded = accelerator.pad_across_processes(t[:3])
model = accelerator.prepare(mlp(1024, 4))
opt = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=1e-4))
x = torch.randn(64, 1024 if BIG else 256, device=accelerator.device)
losses = []
for _ in range(5):
    loss = model(x).pow(2).mean(); accelerator.backward(loss); opt.step(); opt.zero_grad(); losses.append(loss.item())
result(backend=dist.get_backend() if dist.is_initialized() else None, distributed_type=str(accelerator.distributed_type),
       device=str(accelerator.device), gather=gathered.tolist(), reduce=reduced.tolist(), pad=list(padded.shape),
       wrapped=type(model).__name__, loss_first_last=[losses[0], losses[-1]])
accelerator.end_training()
"""

CODE["fsdp2"] = COMMON + ONE_RANK_GROUP + """
import os, tempfile
from pathlib import Path
from hasten import Accelerator
from hasten.utils import FullyShardedDataParallelPlugin
plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="SIZE_BASED_WRAP", min_num_params=1_000_000)
accelerator = Accelerator(mixed_precision="bf16", fsdp_plugin=plugin)
model = mlp(2048, 4)
model = accelerator.prepare(model)
opt = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=1e-4))
x = torch.randn(64, 2048 if BIG else 256, device=accelerator.device)
def step():
    loss = model(x).float().pow(2).mean(); accelerator.backward(loss); opt.step(); opt.zero_grad(); return loss.item()
losses = [step() for _ in range(3)]
root = Path(os.environ["CHECK_DIR"])
accelerator.save_state(root / "ckpt")
before = {k: v.full_tensor().clone() if hasattr(v, "full_tensor") else v.clone() for k, v in model.state_dict().items()}
step()
accelerator.load_state(root / "ckpt")
after = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
restored = all(torch.equal(before[k], after[k]) for k in before)
handle = accelerator.save_state(root / "async", async_save=True); step(); handle.wait()
result(distributed_type=str(accelerator.distributed_type), ranks=accelerator.num_processes,
       backend=dist.get_backend() if dist.is_initialized() else None, wrapped=type(model).__name__, losses=losses,
       restored_exactly=restored, async_published=(root / "async").is_dir(), files=sorted(p.name for p in (root / "ckpt").iterdir()))
accelerator.end_training()
"""

CODE["deepspeed"] = COMMON + ONE_RANK_GROUP + """
import importlib.util
from pathlib import Path
if importlib.util.find_spec("deepspeed") is None:
    result(outcome="deepspeed is not installed on this machine")
    raise SystemExit(0)
from hasten import Accelerator
from hasten.utils import DeepSpeedPlugin
# ZeRO-3 with bf16 on the GPU; save_state, one more step, load_state: the step after loading repeats exactly.
accelerator = Accelerator(mixed_precision="bf16", deepspeed_plugin=DeepSpeedPlugin(zero_stage=3, gradient_accumulation_steps=1))
model = mlp(1024, 4)
model, opt = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
x = torch.randn(64, 1024 if BIG else 256, device=accelerator.device)
def step():
    loss = model(x).float().pow(2).mean(); accelerator.backward(loss); opt.step(); opt.zero_grad(); return loss.item()
losses = [step() for _ in range(3)]
root = Path(os.environ["CHECK_DIR"])
accelerator.save_state(root / "ds")
after_save = [step(), step()]
accelerator.load_state(root / "ds")
after_load = [step(), step()]
result(distributed_type=str(accelerator.distributed_type), ranks=accelerator.num_processes, wrapped=type(model).__name__,
       losses=losses, resumed_exactly=after_save == after_load, after_save=after_save, after_load=after_load)
accelerator.end_training()
"""

CODE["cp"] = COMMON + ONE_RANK_GROUP + """
import copy, os
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from hasten.strategies.parallel.context import context_parallel_context, load_balanced_positions
# Two ranks share the one GPU over gloo (NCCL refuses two ranks on one GPU): torch's ring attention on CUDA
# kernels, hasten's hand-off to it; on a CPU dry run the same code takes hasten's gathered-KV attention.
if DEV == "cuda":
    torch.cuda.set_device(0)
    torch.backends.cuda.matmul.allow_tf32 = False
if not dist.is_initialized():
    dist.init_process_group("gloo")
rank, ranks = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh(DEV, (ranks,), mesh_dim_names=("cp",))
B, S, W, H = 2, 256, 128, 4
class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Linear(W, 3 * W), nn.Linear(W, W)
    def forward(self, x):
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, H, W // H).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(x.shape))
torch.manual_seed(0)
model = Attention().to(DEV); reference = copy.deepcopy(model)
x = torch.randn(B, S, W, device=DEV)
expected = reference(x); expected.pow(2).sum().backward()
local = x.clone()
run = context_parallel_context(mesh, None)
with run(buffers=[local], buffer_seq_dims=[1], no_restore_buffers={local}):
    y = model(local); y.pow(2).sum().backward()
for p in model.parameters():
    dist.all_reduce(p.grad)
mine = load_balanced_positions(S, ranks, rank).to(DEV)
out_diff = (y - expected[:, mine]).abs().max().item()
grad_diff = max((p.grad - r.grad).abs().max().item() for p, r in zip(model.parameters(), reference.parameters()))
ok = out_diff < 1e-4 and grad_diff < 1e-3
if rank == 0:
    result(kind="torch ring attention" if DEV == "cuda" else "hasten gathered-KV (CPU dry run)", ranks=ranks,
           backend=dist.get_backend(),
           local_tokens=y.shape[1], output_max_diff=out_diff, grad_max_diff=grad_diff, within_tolerance=ok)
dist.destroy_process_group()
raise SystemExit(0 if ok else 1)
"""

CODE["parity"] = """
import json, os, subprocess, sys, tempfile, textwrap
SCRIPT = '''
import json, sys, torch
from torch import nn
from LIB import Accelerator
from LIB.utils import set_seed
accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=2)
set_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=40)
data = torch.utils.data.TensorDataset(torch.randn(320, 64), torch.randn(320, 1))
loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
rows = []
for x, y in loader:
    with accelerator.accumulate(model):
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss); opt.step(); sched.step(); opt.zero_grad()
    rows.append([loss.item(), sched.get_last_lr()[0]])
print("ROWS " + json.dumps(rows))
'''
import importlib.util
if importlib.util.find_spec("accelerate") is None:
    print("RESULT " + json.dumps({"outcome": "accelerate not installed"})); sys.exit()
out = {}
for lib in ("accelerate", "hasten"):
    path = tempfile.mktemp(suffix=".py"); open(path, "w").write(SCRIPT.replace("LIB", lib))
    env = dict(os.environ)
    if lib == "accelerate": env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, path], capture_output=True, text=True, env=env, timeout=100)
    lines = [l for l in done.stdout.splitlines() if l.startswith("ROWS ")]
    out[lib] = json.loads(lines[-1][5:]) if lines else done.stderr[-500:]
a, h = out["accelerate"], out["hasten"]
if isinstance(a, list) and isinstance(h, list):
    print("RESULT " + json.dumps({"steps": [len(a), len(h)], "max_loss_diff": max(abs(x[0] - y[0]) for x, y in zip(a, h)),
                                  "lr_equal": [x[1] for x in a] == [y[1] for y in h], "bitwise": a == h}))
else:
    print("RESULT " + json.dumps({"error": {"accelerate": a if isinstance(a, str) else "ok", "hasten": h if isinstance(h, str) else "ok"}}))
"""
