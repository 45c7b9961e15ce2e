"""Run hasten's GPU paths end to end on a machine with CUDA and print one table (never part of the test suite).

    PYTHONPATH=src python scripts/gpu_check.py            # every section, ~5 minutes on one H100/H200
    PYTHONPATH=src python scripts/gpu_check.py --only speed,parity

Each section runs in a child process of its own with a time limit, so one
failure or hang costs only its row. Sections:

- ``speed``: training steps/s of hasten / raw PyTorch on one GPU (an MLP,
  fp32, bf16 autocast, fp16 with a GradScaler), alternating rounds.
- ``parity``: the same script under Accelerate (when installed) and hasten
  on CUDA, bf16, gradient accumulation, a scheduler: per-step losses and LRs.
- ``nccl``: a NCCL process group of 2 ranks through torchrun (needs 2 GPUs;
  without a GPU it runs on gloo, which checks the code): the collectives
  with their shape checks, and DDP training steps.
- ``fsdp2``: FSDP2 on 2 ranks under torchrun (1 rank in a NCCL group of its
  own on a one-GPU machine): bf16 steps, `save_state` /
  `load_state` (sharded), an asynchronous save.
- ``async``: `save_state(async_save=True)` of CUDA tensors: the files equal a
  synchronous save's bit for bit; the training stall against a synchronous save.
- ``dispatch``: `load_checkpoint_and_dispatch` with a GPU budget smaller than the
  model (the rest on the CPU): outputs equal the in-memory model; time beside
  Accelerate's.
- ``compile``: `dynamo_backend="inductor"` and regional compilation
  (`TorchDynamoPlugin(use_regional_compilation=True)`) of 12 repeated blocks:
  first-step time and steps/s against eager and against each other.
- ``fp8``: torchao float8 training through `mixed_precision="fp8"` (an MLP of
  4096-wide Linear layers): steps/s against bf16, layers converted; refused in
  one sentence on a GPU older than Ada; emulated on a CPU dry run.
- ``deepspeed``: ZeRO-3 with bf16 under torchrun (1 rank on a one-GPU
  machine): steps, `save_state`, `load_state`; the two steps after loading
  repeat the two after saving exactly.
- ``cp``: context parallel over 2 ranks: torch's ring attention on CUDA
  through hasten's hand-off (on a one-GPU machine both ranks share it over
  gloo), an attention layer's output and gradients against the unsplit run;
  on a CPU dry run hasten's own gathered-KV attention. ``cp1``: the same on
  one rank (a ring of one; on a GPU, a NCCL group of its own).

The table is printed as Markdown and written to ``$OUT/gpu_check.md`` when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("env", "speed", "parity", "nccl", "fsdp2", "deepspeed", "cp", "cp1", "async", "dispatch", "compile", "fp8")
LIMITS = {"deepspeed": 180, "cp": 90, "fp8": 240, "speed": 90, "parity": 120, "nccl": 90, "fsdp2": 120, "async": 150, "dispatch": 150, "compile": 180}


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CHECK_DIR": tempfile.mkdtemp(prefix="gpu_check_")}  # one folder for every rank
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    return env


def _child(code: str, timeout: float, torchrun: int = 0) -> tuple[int, str]:
    """Run `code` in a fresh interpreter (or under torchrun with `torchrun` ranks); (exit code, output)."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(textwrap.dedent(code))
    command = ([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(torchrun), "--master-port", "29611", f.name]
               if torchrun else [sys.executable, f.name])
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=_env())
        return done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as error:
        return 124, f"timed out after {timeout} s: {(error.stdout or b'')[-2000:]!r}"


def _result(output: str) -> dict:
    """The last line starting with RESULT (a JSON object) of a child's output."""
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    return json.loads(lines[-1][7:]) if lines else {}


# -- the sections' code (each prints `RESULT {json}` as its last word) ---------------------------------------------
COMMON = """
import json, time, torch, statistics
from torch import nn
def result(**kw): print("RESULT " + json.dumps(kw), flush=True)
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # a dry run on a CPU machine checks the code, not the GPU
def sync(): torch.cuda.synchronize() if DEV == "cuda" else None
BIG = DEV == "cuda"  # sizes for a GPU; a CPU dry run uses small ones
def mlp(width=None, depth=6):
    width = width if BIG or width is None else min(width, 256)
    width = width or (2048 if BIG else 256)
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.GELU())], nn.Linear(width, 1))
"""

CODE = {
    "env": COMMON + """
import importlib.util, hasten
acc = importlib.import_module("accelerate").__version__ if importlib.util.find_spec("accelerate") else "not installed"
have = {name: importlib.util.find_spec(name) is not None for name in ("deepspeed", "torchao", "transformer_engine")}
result(**have, torch=torch.__version__, gpu=torch.cuda.get_device_name(0) if DEV == "cuda" else "none",
       hasten=hasten.__version__, accelerate=acc, nccl=".".join(map(str, torch.cuda.nccl.version())) if DEV == "cuda" else "none")
""",
    "speed": COMMON + """
from hasten import Accelerator
rows = {}
for precision in ("no", "bf16", "fp16"):
    from hasten.state import AcceleratorState
    AcceleratorState._reset_state(True) if hasattr(AcceleratorState, "_reset_state") else None
    accelerator = Accelerator(mixed_precision=precision)
    raw_model, model = mlp().to(DEV), mlp()
    raw_opt = torch.optim.AdamW(raw_model.parameters(), lr=1e-4)
    model, opt = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-4))
    scaler = torch.amp.GradScaler(DEV) if precision == "fp16" and DEV == "cuda" else None
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    x = torch.randn(256, 2048 if BIG else 256, device=DEV)
    def raw_step():
        with torch.autocast(DEV, dtype=dtype, enabled=dtype is not None):
            loss = raw_model(x).float().pow(2).mean()
        if scaler: scaler.scale(loss).backward(); scaler.step(raw_opt); scaler.update()
        else: loss.backward(); raw_opt.step()
        raw_opt.zero_grad(set_to_none=True)
    def our_step():
        loss = model(x).float().pow(2).mean()
        accelerator.backward(loss); opt.step(); opt.zero_grad()
    ratios, speeds = [], {"raw": [], "hasten": []}
    for round_ in range(7):
        timing = {}
        for name, step in (("raw", raw_step), ("hasten", our_step)) if round_ % 2 == 0 else (("hasten", our_step), ("raw", raw_step)):
            for _ in range(3): step()
            sync(); start = time.perf_counter()
            for _ in range(30): step()
            sync(); timing[name] = 30 / (time.perf_counter() - start)
            speeds[name].append(timing[name])
        if round_: ratios.append(timing["hasten"] / timing["raw"])
    rows[precision] = {"raw": round(statistics.median(speeds["raw"]), 1), "hasten": round(statistics.median(speeds["hasten"]), 1),
                       "ratio": round(statistics.median(ratios), 3)}
result(**rows)
""",
    "async": COMMON + """
import tempfile
from pathlib import Path
from hasten import Accelerator
def files(d): return {p.name: p.read_bytes() for p in sorted(Path(d).iterdir()) if p.is_file()}
accelerator = Accelerator()
model = mlp(4096, 8)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
model, opt = accelerator.prepare(model, opt)
x = torch.randn(64, 4096 if BIG else 256, device=DEV)
def step():
    accelerator.backward(model(x).pow(2).mean()); opt.step(); opt.zero_grad(); sync()
step()
root = Path(tempfile.mkdtemp())
accelerator.save_state(root / "sync")
handle = accelerator.save_state(root / "async", async_save=True)
step()
handle.wait()
a, b = files(root / "sync"), files(root / "async")
differing = [n for n in a if n != "hasten_checkpoint.json" and a[n] != b.get(n)]
times = {"step": [], "sync": [], "call": [], "next": []}
for r in range(2):
    s = time.perf_counter(); step(); times["step"].append(time.perf_counter() - s)
    s = time.perf_counter(); accelerator.save_state(root / f"s{r}"); times["sync"].append(time.perf_counter() - s)
    s = time.perf_counter(); h = accelerator.save_state(root / f"a{r}", async_save=True); times["call"].append(time.perf_counter() - s)
    s = time.perf_counter(); step(); times["next"].append(time.perf_counter() - s); h.wait()
m = {k: min(v) for k, v in times.items()}
state_gb = sum(p.numel() for p in model.parameters()) * 4 * 3 / 1e9
result(same_files=sorted(a) == sorted(b), differing=differing, state_gb=round(state_gb, 2), sync_s=round(m["sync"], 3),
       call_s=round(m["call"], 4), stall_ratio=round(m["call"] / m["sync"], 4),
       next_step_extra_s=round(m["next"] - m["step"], 4))
""",
    "dispatch": COMMON + """
import tempfile, subprocess, sys, os
from pathlib import Path
from safetensors.torch import save_file
from hasten import init_empty_weights
from hasten.big_modeling import load_checkpoint_and_dispatch
folder = Path(tempfile.mkdtemp())
W = 4096 if BIG else 256
model = mlp(W, 12)   # ~800 MB of fp32 weights on a GPU
save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
x = torch.randn(8, W)
expected = model.to(DEV)(x.to(DEV)).float().cpu(); del model; None
budget = {0: "300MiB", "cpu": "4GiB"} if BIG else {"cpu": "4GiB"}
with init_empty_weights(): empty = mlp(W, 12)
loaded = load_checkpoint_and_dispatch(empty, str(folder / "model.safetensors"), device_map="auto", max_memory=budget)
got = loaded(x.to(DEV)).float().cpu()
on_gpu = sum(1 for p in loaded.parameters() if p.device.type == DEV)
sync(); s = time.perf_counter()
for _ in range(5): loaded(x.to(DEV))
sync(); fwd = (time.perf_counter() - s) / 5
# The load times: each library in a fresh process (CUDA initialised first, outside the timing), alternating, 3 rounds,
# medians; with --verbose hasten's load is profiled in one more process.
code = '''
import time, torch, json, sys
from torch import nn
if sys.argv[1] == "hasten":
    from hasten import init_empty_weights, load_checkpoint_and_dispatch
else:
    from accelerate import init_empty_weights, load_checkpoint_and_dispatch
def mlp(width={W}, depth=12):
    return nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.GELU())], nn.Linear(width, 1))
torch.zeros(1, device="{DEV}")
with init_empty_weights(): empty = mlp()
if len(sys.argv) > 2:
    import cProfile; cProfile.run("load_checkpoint_and_dispatch(empty, '{file}', device_map='auto', max_memory={budget!r})", sort="tottime")
s = time.perf_counter()
m = load_checkpoint_and_dispatch(empty, "{file}", device_map="auto", max_memory={budget!r})
print("LOAD", json.dumps(time.perf_counter() - s))
'''.format(W=W, DEV=DEV, file=folder / "model.safetensors", budget=budget)
import importlib.util
libraries = ["hasten"] + (["accelerate"] if importlib.util.find_spec("accelerate") else [])
times = {lib: [] for lib in libraries}
for _ in range(3):
    for lib in libraries:
        env = {k: v for k, v in os.environ.items() if lib == "hasten" or k != "PYTHONPATH"}
        out = subprocess.run([sys.executable, "-c", code, lib], capture_output=True, text=True, timeout=100, env=env)
        lines = [l for l in out.stdout.splitlines() if l.startswith("LOAD")]
        times[lib].append(json.loads(lines[-1][5:]) if lines else float("nan"))
if os.environ.get("GPU_CHECK_VERBOSE"):
    print(subprocess.run([sys.executable, "-c", code, "hasten", "profile"], capture_output=True, text=True, timeout=100).stdout[-3000:])
median = {lib: round(sorted(t)[1], 3) for lib, t in times.items()}
result(max_abs_diff=float((got - expected).abs().max()), params_on_gpu=on_gpu, params=len(list(loaded.parameters())),
       load_s=median["hasten"], accelerate_load_s=median.get("accelerate"), offloaded_forward_ms=round(fwd * 1e3, 2))
""",
    "compile": COMMON + """
from hasten import Accelerator
from hasten.state import AcceleratorState
from hasten.utils import TorchDynamoPlugin
class Blocks(nn.Module):  # repeated blocks in a ModuleList: what regional compilation compiles once and reuses
    def __init__(self, width, depth):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth))
        self.head = nn.Linear(width, 1)
    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)
rows = {}
for backend in ("no", "inductor", "regional"):
    AcceleratorState._reset_state(True)
    plugin = TorchDynamoPlugin(backend="inductor", use_regional_compilation=True) if backend == "regional" else None
    accelerator = Accelerator(mixed_precision="bf16", **({"dynamo_plugin": plugin} if plugin else {"dynamo_backend": backend}))
    torch.manual_seed(0)
    model = accelerator.prepare(Blocks(2048 if BIG else 256, 12))
    opt = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=1e-4))
    x = torch.randn(256, 2048 if BIG else 256, device=DEV)
    def step():
        accelerator.backward(model(x).float().pow(2).mean()); opt.step(); opt.zero_grad()
    s = time.perf_counter(); step(); sync(); first = time.perf_counter() - s
    for _ in range(5): step()
    sync(); s = time.perf_counter()
    for _ in range(50): step()
    sync()
    rows[backend] = {"first_step_s": round(first, 2), "steps_per_s": round(50 / (time.perf_counter() - s), 1),
                     "compiled": type(accelerator.unwrap_model(model, keep_torch_compile=True)).__name__}
result(**rows, speedup=round(rows["inductor"]["steps_per_s"] / rows["no"]["steps_per_s"], 3),
       regional_vs_whole_first_step=round(rows["regional"]["first_step_s"] / rows["inductor"]["first_step_s"], 3),
       regional_vs_whole_steps=round(rows["regional"]["steps_per_s"] / rows["inductor"]["steps_per_s"], 3))
""",
    "fp8": COMMON + """
import importlib.util
from hasten import Accelerator
from hasten.state import AcceleratorState
if importlib.util.find_spec("torchao") is None:
    result(outcome="torchao is not installed on this machine (pip install torchao)")
    raise SystemExit(0)
rows = {}
# fp8: torchao Float8Linear (real on 8.9+, else refused; emulated on a CPU dry run); its gain needs inductor (torchtitan)
for name in ("bf16", "fp8", "bf16+inductor", "fp8+inductor"):
    precision, compiled = name.split("+")[0], name.endswith("inductor")
    if compiled and DEV == "cpu":
        continue
    AcceleratorState._reset_state(True)
    try:
        handlers = []
        if DEV == "cpu" and precision == "fp8":
            from torchao.float8 import Float8LinearConfig
            from hasten.utils import AORecipeKwargs
            handlers = [AORecipeKwargs(config=Float8LinearConfig(emulate=True))]
        accelerator = Accelerator(mixed_precision=precision, kwargs_handlers=handlers,
                                  dynamo_backend="inductor" if compiled else None)
    except Exception as error:
        rows[name] = f"{type(error).__name__}: {error}"
        continue
    model = mlp(4096 if BIG else None, depth=8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    x = torch.randn(8192 if BIG else 64, model[0].in_features, device=DEV)
    def step():
        loss = model(x).float().pow(2).mean(); accelerator.backward(loss); optimizer.step(); optimizer.zero_grad()
        return loss
    for _ in range(3): step()
    sync(); s = time.perf_counter()
    for _ in range(20): loss = step()
    sync()
    rows[name] = {"steps_per_s": round(20 / (time.perf_counter() - s), 2), "loss": round(float(loss), 6),
                  "float8_layers": sum(type(m).__name__ == "Float8Linear" for m in model.modules())}
def ratio(a, b):
    return round(rows[a]["steps_per_s"] / rows[b]["steps_per_s"], 3) if isinstance(rows.get(a), dict) and isinstance(rows.get(b), dict) else None
result(**rows, fp8_vs_bf16=ratio("fp8", "bf16"), compiled_fp8_vs_bf16=ratio("fp8+inductor", "bf16+inductor"))
""",
}

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated sections (default: all)")
    parser.add_argument("--verbose", action="store_true", help="print each section's own output (e.g. the dispatch profile)")
    args = parser.parse_args(argv)
    chosen = [s for s in SECTIONS if not args.only or s in args.only.split(",")]
    if args.verbose:
        os.environ["GPU_CHECK_VERBOSE"] = "1"
    rows = []
    import torch

    gpus = torch.cuda.device_count()
    for section in chosen:
        if section == "nccl" and gpus == 1:  # NCCL refuses two ranks on one GPU, and one rank runs no DDP
            rows.append((section, "skipped", 0.0, "needs 2 GPUs (NCCL puts one rank on each); this machine has 1"))
            print(f"[{section}] skipped: {rows[-1][3]}", flush=True)
            continue
        start = time.perf_counter()
        ranks = 1 if section in ("fsdp2", "deepspeed") and gpus == 1 or section == "cp1" else 2  # cp: 2 ranks share a GPU
        code, output = _child(CODE["cp" if section == "cp1" else section], LIMITS.get(section, 60),
                              torchrun=ranks if section in ("nccl", "fsdp2", "deepspeed", "cp", "cp1") else 0)
        found = _result(output)
        status = "ok" if code == 0 and found else f"FAILED (exit {code})"
        detail = json.dumps(found) if found else output.strip().splitlines()[-1][:300] if output.strip() else ""
        rows.append((section, status, round(time.perf_counter() - start, 1), detail))
        print(f"[{section}] {status} in {rows[-1][2]} s: {detail}", flush=True)
        if os.environ.get("OUT"):  # row by row: a run stopped at its limit keeps what it measured
            with open(Path(os.environ["OUT"], "gpu_check_rows.txt"), "a") as rows_file:
                rows_file.write(f"{section}\t{status}\t{rows[-1][2]}\t{detail}\n")
        if status != "ok" or args.verbose:
            print(output[-3000:], flush=True)
    table = ["| section | status | seconds | result |", "|---|---|---|---|"]
    table += [f"| {s} | {st} | {sec} | `{d}` |" for s, st, sec, d in rows]
    text = "\n".join(table)
    print("\n" + text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check.md").write_text(text + "\n")
    return 0 if all(r[1] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
