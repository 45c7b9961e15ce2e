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
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the section files beside this one
from gpu_check_common import COMMON  # noqa: E402

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

from gpu_check_distributed import CODE as _DISTRIBUTED  # noqa: E402

CODE.update(_DISTRIBUTED)


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
