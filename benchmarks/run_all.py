"""Run every benchmark in benchmarks/ and write benchmarks/RESULTS.md and benchmarks/results.png.

    python benchmarks/run_all.py            # the full run: the figures to commit (tens of minutes on 2 CPU cores)
    python benchmarks/run_all.py --quick    # every script with --quick: minutes, noisier

Run it with a Python that has the peers installed (Hugging Face Accelerate, Lightning Fabric) to
measure them side by side with hasten: every peer figure is taken in the same run, alternating
with hasten's and the raw PyTorch baseline's. hasten never needs the peers; without them their
columns say so.

Each script runs in its own process, one after the other, with its own time limit, and appends its
figures as JSON lines to the file named by HASTEN_BENCH_RESULTS (see _results.py); the command
keeps them in benchmarks/results.jsonl next to RESULTS.md, together with the machine, the versions
and each script's console output. `--from-results FILE` writes RESULTS.md and the chart again from
such a file without running anything.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# script, timeout (s) for the full run, timeout with --quick, module it needs (or None)
BENCHMARKS = [
    ("overhead.py", 7200, 1800, None),
    ("launch.py", 2400, 900, None),
    ("checkpoint.py", 3600, 900, None),
    ("sharded.py", 3600, 1200, None),
    ("deepspeed_steps.py", 3600, 1200, "deepspeed"),
    ("big_model.py", 3600, 1200, None),
    ("faults.py", 1800, 900, None),
    ("compile.py", 1800, 600, None),
]
PEERS = {"accelerate": "accelerate", "fabric": "lightning"}  # name -> module
FRAMEWORKS = ["hasten", *PEERS]
TARGETS = {"steps": 0.99, "import": 1.05, "launch": 1.05, "gather": 1.10, "parameters": 1e-6}
# left out of RESULTS.md's copy of the console output (results.jsonl keeps each once): DeepSpeed's line
# per process, and Python warnings (their line and the source line under it)
NOISE = re.compile(r"real_accelerator\.py.*Setting accelerator to CPU|^\S+\.py:\d+: \w*Warning: ")


def quiet(text: str) -> tuple[list[str], int]:
    """The console output without the noise lines; and how many were left out."""
    kept, dropped, skip_source_line = [], 0, False
    for line in text.splitlines():
        if skip_source_line and line.startswith("  "):
            dropped += 1
        elif NOISE.search(line):
            dropped += 1
            skip_source_line = "Warning: " in line
            continue
        else:
            kept.append(line)
        skip_source_line = False
    return kept, dropped


def once(text: str) -> tuple[str, int]:
    """The console output with each noise line (and the source line under a warning) kept only the first time."""
    kept, seen, dropped, previous_dropped = [], set(), 0, False
    for line in text.splitlines():
        if previous_dropped and line.startswith("  "):
            dropped += 1
            continue
        previous_dropped = False
        if NOISE.search(line):
            key = re.sub(r"^\[[^]]*\]", "", line)  # DeepSpeed's lines start with a timestamp
            if key in seen:
                dropped += 1
                previous_dropped = "Warning: " in line
                continue
            seen.add(key)
        kept.append(line)
    return "\n".join(kept) + ("\n" if kept else ""), dropped


# ---------------------------------------------------------------------------- machine and versions
def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30, check=False,
                              env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"}).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = int(line.split()[1]) * 1024
    except OSError:
        pass
    os_name = platform.platform()
    try:
        release = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line)
        os_name += f" ({release.get('PRETTY_NAME', '').strip(chr(34))})"
    except OSError:
        pass
    commit = _git("rev-parse", "--short", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    return {
        "cpu": cpu, "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "ram_gib": ram / 2**30 if ram else None, "os": os_name,
        "python": f"{platform.python_version()} ({sys.executable})",
        "versions": {name: _version(name) for name in ("torch", "hasten", "accelerate", "lightning", "deepspeed",
                                                       "safetensors", "matplotlib")},
        "hasten_commit": (commit + (" + uncommitted changes" if dirty else "")) if commit else None,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


# ---------------------------------------------------------------------------- running
def run_script(script: str, args: list[str], timeout: float, index: int, total: int) -> tuple[int | None, float, str]:
    """Run one benchmark, echoing its output as it comes; returns (exit code or None on timeout, seconds, output)."""
    command = [sys.executable, str(HERE / script), *args]
    print(f"\n==> [{index}/{total}] {script} {' '.join(args)}  (time limit {timeout:.0f} s)", flush=True)
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                               start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []

    def pump() -> None:
        for line in process.stdout:
            lines.append(line)
            sys.stdout.write(line)
            sys.stdout.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        from _launch import kill_tree

        kill_tree(process.pid)  # the script and every process it started
        process.wait()
        code = None
    reader.join(timeout=10)
    seconds = time.monotonic() - started
    print(f"<== {script}: {'TIMED OUT, killed' if code is None else f'exit {code}'} after {seconds:.0f} s", flush=True)
    return code, seconds, "".join(lines)


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------------------- formatting helpers
def f(value, digits: int = 2, unit: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def verdict(ok) -> str:
    return "—" if ok is None else ("ok" if ok else "**MISSED**")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    def cell(value) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(cell(c) for c in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return out + [""]


def by(records: list[dict], section: str) -> list[dict]:
    return [r for r in records if r["section"] == section]


def lookup(records: list[dict], section: str, name: str, framework: str) -> dict | None:
    for r in records:
        if r["section"] == section and r["name"] == name and r.get("framework") == framework:
            return r
    return None


def names(records: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["name"] for r in records))


def merge(new: list[dict], old: list[dict], rerun: set[str]) -> list[dict]:
    """This run's records, then the previous run's records of every script this run did not run.

    A script's records are those written before its ``_run`` record (scripts run one after the other);
    the new ``_meta`` record names the scripts kept and the run they come from.
    """
    kept: list[dict] = []
    group: list[dict] = []
    names: list[str] = []
    old_meta = next((r for r in old if r["section"] == "_meta"), {})
    for record in old:
        if record["section"] == "_meta":
            continue
        group.append(record)
        if record["section"] == "_run":
            if record["name"] not in rerun:
                kept += group
                names.append(record["name"])
            group = []
    meta = next(r for r in new if r["section"] == "_meta")
    meta["kept"] = {"scripts": names, "date": old_meta.get("date"), "commit": old_meta.get("hasten_commit"),
                    "command": old_meta.get("command")}
    return new + kept


# ---------------------------------------------------------------------------- RESULTS.md
def render(records: list[dict], quick: bool) -> str:
    meta = next((r for r in records if r["section"] == "_meta"), {})
    runs = by(records, "_run")
    peers = [p for p in PEERS if meta.get("peers", {}).get(p)]
    absent = [p for p in PEERS if p not in peers]
    peer_title = {"accelerate": "Accelerate", "fabric": "Fabric"}
    lines = ["# Benchmark results", ""]
    lines += [(f"Written by `{meta.get('command', 'python benchmarks/run_all.py')}` on {meta.get('date', '?')}; "
              "do not edit by hand, run the command again. Raw figures: `results.jsonl`; chart: `results.png`."), ""]
    if quick:
        lines += ["**Quick mode** (`--quick`): fewer rounds and smaller models; noisier, not the figures to quote.", ""]
    if meta.get("only") and meta.get("kept", {}).get("scripts"):
        kept = meta["kept"]
        lines += [f"**Partly rerun**: {', '.join(meta['only'])} on {meta.get('date')} (commit "
                  f"{meta.get('hasten_commit')}); {', '.join(kept['scripts'])} are from the run of {kept['date']} "
                  f"(commit {kept['commit']}, `{kept['command']}`).", ""]
    elif meta.get("only"):
        lines += [f"**Partial run**: only {', '.join(meta['only'])}.", ""]
    lines += ["hasten against raw PyTorch (what a careful user writes by hand: DDP + DistributedSampler + `no_sync` + "
              "`torch.autocast`, `fully_shard`, `deepspeed.initialize`, `torchrun`, `torch.save`), and against the "
              "peers installed in the same environment, each written its own documented way: "
              + (", ".join(f"{peer_title[p]} {meta['versions'].get(PEERS[p]) or ''}".strip() for p in peers) or "none")
              + "." + (f" Not installed here, so not measured: {', '.join(peer_title[p] for p in absent)}." if absent else "")
              + " Every ratio comes from runs side by side in one invocation, alternating in short rounds so that "
              "machine noise hits all alike.", ""]

    # machine
    v = meta.get("versions", {})
    lines += ["## Machine and versions", ""]
    lines += table(["", ""], [
        ["CPU", f"{meta.get('cpu')} — {meta.get('usable_cores')} cores usable ({meta.get('cores')} in the machine)"],
        ["Memory", f(meta.get("ram_gib"), 1, " GiB")],
        ["OS", meta.get("os")],
        ["Python", meta.get("python")],
        ["torch", v.get("torch")],
        ["hasten", f"{v.get('hasten')}, commit {meta.get('hasten_commit')}"],
        ["accelerate", v.get("accelerate") or "not installed"],
        ["lightning (Fabric)", v.get("lightning") or "not installed"],
        ["deepspeed", v.get("deepspeed") or "not installed"],
        ["safetensors / matplotlib", f"{v.get('safetensors')} / {v.get('matplotlib')}"],
        ["Date", meta.get("date")],
        ["Command", f"`{meta.get('command')}`"],
    ])
    failed = [r for r in runs if r.get("exit") != 0]
    if failed or meta.get("skipped"):
        lines += ["Scripts that did not complete: " + "; ".join(
            [f"`{r['name']}` ({'timed out' if r.get('exit') is None else 'exit ' + str(r.get('exit'))})" for r in failed]
            + [f"`{s}` (skipped: {why})" for s, why in meta.get("skipped", {}).items()])
            + ". Their tables are missing or partial; their output is at the end.", ""]

    # summary of targets
    steps = by(records, "steps")
    hasten_steps = [r for r in steps if r.get("framework") == "hasten"]
    rows = []
    if hasten_steps:
        worst = min(hasten_steps, key=lambda r: _measure(r) or 0)
        missed = [r["name"] for r in hasten_steps if r.get("ok") is False]
        engines = ", ".join(dict.fromkeys(r.get("engine", "?") for r in hasten_steps))
        rows.append([f"training steps/s, hasten / raw, every engine measured ({engines})", "≥ 0.99",
                     f"lowest {f(_measure(worst), 3)} ({worst['name']}); {len(hasten_steps) - len(missed)} of "
                     f"{len(hasten_steps)} configurations meet it" + (f"; missed: {', '.join(missed)}" if missed else ""),
                     verdict(not missed)])
    for name in ("import hasten", "from hasten import Accelerator"):
        r = lookup(records, "import", name, "hasten")
        if r:
            rows.append([f"`{name}` / `import torch`", "≤ 1.05", f(r["ratio"], 3), verdict(r["ok"])])
    for name in ("hasten launch", "hasten launch + hasten.Accelerator"):
        r = lookup(records, "launch", name, "hasten")
        if r:
            what = "trivial script" if name == "hasten launch" else "script building an Accelerator"
            rows.append([f"`hasten launch` / `torchrun` ({what})", "≤ 1.05", f(r["ratio"], 3), verdict(r["ok"])])
    r = lookup(records, "gather", "all-gather of 1M floats", "hasten")
    if r:
        rows.append(["`gather` of 1M floats / raw all-gather", "≤ 1.10", f(r["ratio"], 3), verdict(r["ok"])])
    params = [r for r in by(records, "parameters") if r.get("framework") == "hasten"]
    if params:
        worst = max(params, key=lambda r: r["max_diff"])
        rows.append(["fp32 parameters after the same training, max |hasten − raw|", "≤ 1e-6",
                     f"{worst['max_diff']:.1e} ({worst['name']})", verdict(all(r["ok"] for r in params))])
    beat = lookup(records, "liveness", "heartbeat thread, raw DDP mlp loop", "hasten")
    if beat:
        control = lookup(records, "liveness", "heartbeat thread, raw DDP mlp loop (A/A control)", "hasten")
        rows.append(["liveness heartbeat (a thread per process): raw DDP steps/s with / without it",
                     "within the noise", f"{f(beat['ratio'], 3)}, CPU {f(beat.get('cpu_ratio'), 3)} (one beat "
                     f"{f(beat['beat_us'], 0)} µs a second)" + (f"; A/A control {f(control['ratio'], 3)}, CPU "
                                                                 f"{f(control.get('cpu_ratio'), 3)}" if control else ""),
                     "—"])
    faults = [r for r in by(records, "faults") if r.get("framework") == "hasten"]
    if faults:
        rows.append(["faults: exact resume, preemption, hang detection (below)", "all hold",
                     f"{sum(bool(r['holds']) for r in faults)} of {len(faults)} hold", verdict(all(r["holds"] for r in faults))])
    if rows:
        lines += ["## Targets", ""]
        lines += table(["what", "target", "measured", "verdict"], rows)

    # training speed
    if steps:
        lines += ["## Training speed, 2 processes", ""]
        lines += [("Ratio = median over rounds of (framework steps/s) / (raw steps/s), measured in the same 2 "
                  "processes (gloo, one thread each). DDP and FSDP2: in each round the loops' steps interleave, one "
                  "step of each in turn, each timed alone; DeepSpeed ZeRO: the two engines alternate in short rounds. "
                  "*wall*: by wall clock; *CPU*: by the main thread's CPU time, which is what a framework's Python "
                  "adds per step and much steadier on a shared VM. The verdict uses the measure each script states: "
                  "the CPU ratio for DDP, the better of both for DeepSpeed ZeRO, wall clock for FSDP2. DDP models: an MLP (32-64-64-1, "
                  "batch 32 per rank) and a 2-layer transformer encoder (d=64, sequence 16, batch 8 per rank); "
                  "FSDP2: a 4-layer transformer LM (d=256); ZeRO: an MLP (64-256-256-1). The peers were measured "
                  "on DDP only (their FSDP/DeepSpeed set-ups differ too much to pair fairly); `+preempt` is hasten "
                  "with preemption handling on (no peer equivalent)."), ""]
        header = ["engine / model / precision / accumulation", "raw steps/s", "hasten steps/s", "hasten/raw wall",
                  "hasten/raw CPU", "target ≥ 0.99"]
        for p in peers:
            header += [f"{peer_title[p]}/raw wall", f"{peer_title[p]}/raw CPU"]
        rows = []
        for name in names(steps):
            h = lookup(records, "steps", name, "hasten")
            if not h:
                continue
            row = [name, f(h.get("raw_steps_s"), 1), f(h.get("steps_s"), 1), f(h.get("wall_ratio"), 3),
                   f(h.get("cpu_ratio"), 3), verdict(h.get("ok"))]
            for p in peers:
                r = lookup(records, "steps", name, p)
                row += [f(r.get("wall_ratio"), 3), f(r.get("cpu_ratio"), 3)] if r else ["—", "—"]
            rows.append(row)
        lines += table(header, rows)

    # parameters
    params = by(records, "parameters")
    if params:
        lines += ["### Same training, same parameters", "",
                  ("Max |parameter − raw loop's parameter| after 48 fp32 steps from the same seed (the check that "
                  "every loop above does the same work; DistributedSampler and batch sharding give each step the "
                  "same samples, so only summation order may differ)."), ""]
        header = ["model / accumulation", "training moved parameters by", "hasten", "target ≤ 1e-6"] + [peer_title[p] for p in peers]
        rows = []
        for name in names(params):
            h = lookup(records, "parameters", name, "hasten")
            row = [name, f"{h['moved']:.1e}", f"{h['max_diff']:.1e}", verdict(h["ok"])]
            for p in peers:
                r = lookup(records, "parameters", name, p)
                row.append(f"{r['max_diff']:.1e}" if r else "—")
            rows.append(row)
        lines += table(header, rows)

    # import
    imports = by(records, "import")
    if imports:
        lines += ["## Import time", "", f"Fresh interpreter, median of {imports[0].get('repeats')} (alternating).", ""]
        rows = [[f"`{r['name']}`", f(r["ms"], 0, " ms"), f(r["ratio"], 3),
                 "≤ 1.05" if r["framework"] == "hasten" else "", verdict(r["ok"]) if r["framework"] == "hasten" else ""]
                for r in imports]
        lines += table(["statement", "time", "ratio to `import torch`", "target", "verdict"], rows)

    # launch
    launches = [r for r in by(records, "launch") if not r.get("help")]
    if launches:
        lines += ["## Launch to exit, 2 processes", "",
                  (f"Median of {launches[0].get('repeats')} runs of each, rotating the order. The trivial script: "
                  "`init_process_group` + one all_reduce + barrier + destroy. The Accelerator script: "
                  "`Accelerator(cpu=True)`, one `reduce`, `wait_for_everyone`, `end_training` — the same file for "
                  "both frameworks but for its import line; its ratio is taken to `torchrun` of the raw trivial "
                  "script (the cost of launcher and Accelerator together)."
                  + (" `accelerate launch --multi_gpu --num_processes 2` is Accelerate's 2-process launch (on CPUs, "
                     "`cpu=True` in the script makes the 2 processes one gloo group; `--cpu` would start one process)."
                     if any(r["framework"] == "accelerate" for r in launches) else "")), ""]
        rows = [[r["name"], f(r["seconds"], 2, " s"), f(r["min_seconds"], 2, " s"), f(r["ratio"], 3),
                 "≤ 1.05" if r["framework"] == "hasten" else "", verdict(r["ok"]) if r["framework"] == "hasten" else ""]
                for r in launches]
        lines += table(["launcher + script", "median", "min", "ratio to torchrun (raw script)", "target", "verdict"], rows)
        helps = [r for r in by(records, "launch") if r.get("help")]
        if helps:
            lines += ["CLI help without importing torch: " + ", ".join(f"`{r['name']}` {r['seconds'] * 1e3:.0f} ms"
                                                                     for r in helps) + ".", ""]

    # collectives
    g = lookup(records, "gather", "all-gather of 1M floats", "hasten")
    if g:
        lines += ["## Collectives", "",
                  (f"Median of {g.get('rounds')} alternating rounds, 2 processes (gloo). Raw: "
                  "`all_gather_into_tensor` into a preallocated tensor."), ""]
        header = ["", "raw", "hasten", "hasten/raw", "target ≤ 1.10"] + [f"{peer_title[p]} (ratio)" for p in peers]
        row = ["all-gather of 1M floats", f(g["raw_ms"], 2, " ms"), f(g["ms"], 2, " ms"), f(g["ratio"], 3), verdict(g["ok"])]
        for p in peers:
            r = lookup(records, "gather", "all-gather of 1M floats", p)
            row.append(f"{r['ms']:.2f} ms ({r['ratio']:.3f})" if r else "—")
        rows = [row]
        t = lookup(records, "gather", "reduce of 1 float", "hasten")
        if t:
            rows.append(["reduce of 1 float (fixed cost per collective)", f(t["raw_us"], 0, " µs"), f(t["us"], 0, " µs"),
                         f(t["us"] / t["raw_us"], 2), "—"] + ["—" for _ in peers])
        lines += table(header, rows)

    # memory
    memory = by(records, "memory")
    if memory:
        lines += ["## Peak memory", ""]
        sharded = [r for r in memory if r.get("mode")]
        if sharded:
            lines += [(f"Per rank (the larger of the 2), a {sharded[0]['params_m']:.0f}M-parameter transformer LM with "
                      "AdamW in fp32, 3 training steps, each mode in its own `hasten launch`. *Training*: the kernel's "
                      "high-water mark reset after `prepare`; *whole run*: including building the full model on every "
                      "rank; *held*: bytes of parameters + gradients + optimizer state the rank keeps."), ""]
            rows = [[r["mode"], f"{r['training_peak_gib']:.2f} GiB ({r['training_peak_ratio']:.2f}x)",
                     f"{r['peak_gib']:.2f} GiB ({r['peak_ratio']:.2f}x)", f"{r['held_gib']:.2f} GiB ({r['held_ratio']:.2f}x)"]
                    for r in sharded]
            lines += table(["mode (ratio to DDP)", "peak RSS, training", "peak RSS, whole run", "held"], rows)
        others = [r for r in memory if not r.get("mode")]
        if sharded:
            lines += ["(hasten only: the peers' FSDP and DeepSpeed set-ups are not measured here.)", ""]
        if others:
            lines += ["Peak RSS of the speed benchmarks (all their loops in the same processes): "
                      + "; ".join(f"{r['name']}: {r['peak_mib']:.0f} MiB" for r in others) + ".", ""]

    # big model
    big = by(records, "big_model")
    if big:
        b = big[0]
        lines += ["## Loading a model bigger than its CPU budget", "",
                  (f"{b['params_m']:.0f}M parameters ({b['weights_mib']:.0f} MiB of fp32 weights in sharded safetensors, "
                  f"largest block {b['block_mib']:.0f} MiB), CPU budget {b['budget']}: the blocks that do not fit stay "
                  f"on disk, memory-mapped one block at a time in the forward. Each way in a fresh process; peak = "
                  f"growth of the peak RSS over what the process held before loading. Bound for the offloaded "
                  f"loads: budget + largest block = {b['bound_mib']:.0f} MiB."), ""]
        rows = [[{"load_state_dict": "`load_state_dict` (all in memory)", "hasten": "hasten `load_checkpoint_and_dispatch`",
                  "accelerate": "Accelerate `load_checkpoint_and_dispatch`"}.get(r["name"], r["name"]),
                 f(r["load_s"], 2, " s"), f(r["load_peak_mib"], 0, " MiB"), f(r["peak_mib"], 0, " MiB"),
                 "—" if r.get("within_bound") is None else ("yes" if r["within_bound"] else ("**no**" if r["name"] == "hasten" else "no")),
                 f(r["tokens_per_s"], 0), f(r["speed_vs_loaded"], 3), f"{r['max_diff']:.1e}", r["modules_on_disk"]]
                for r in big]
        lines += table(["way", "load time", "peak while loading", "peak incl. forward", "within bound",
                        "forward tokens/s", "vs all in memory", "max |out diff|", "blocks on disk"], rows)
        if "accelerate" not in [r["name"] for r in big]:
            lines += ["(Accelerate not installed: no Accelerate row.)", ""]

    # torch.compile
    compiled = [r for r in by(records, "compile") if "steps_s" in r]
    if compiled:
        c, pair = compiled[0], next((r for r in by(records, "compile") if "compile_ratio" in r), {})
        lines += ["## torch.compile: whole model vs regional", "",
                  (f"{c['blocks']} `nn.TransformerEncoderLayer` blocks (d={c['width']}) trained with AdamW through "
                   f"hasten on 1 CPU thread, inductor; each variant in a fresh process with a cold cache, median of "
                   f"{c['rounds']} alternating rounds. *compile*: first step minus a steady step. Regional / whole: "
                   f"compile time {f(pair.get('compile_ratio'), 3)}, steps/s {f(pair.get('speed_ratio'), 3)}."), ""]
        rows = [[r["name"], f(r["compile_s"], 2, " s"), f(r["steps_s"], 1), f(r["speed_vs_eager"], 3),
                 f"{r['loss_diff']:.1e}"] for r in compiled]
        lines += table(["variant", "compile", "steps/s", "vs eager", "|loss − eager|"], rows)

    # checkpoints
    ckpt = by(records, "checkpoint")
    if ckpt:
        ratios = next((r for r in ckpt if r["name"] == "ratios"), None)
        lines += ["## Checkpoints", ""]
        timed = [r for r in ckpt if "seconds" in r]
        if timed:
            lines += [(f"One process, a {timed[0]['params_m']:.0f}M-parameter model + AdamW state, median of "
                      f"{timed[0]['rounds']} rounds rotating the order. *disk*: the same bytes written with "
                      "os.write + fsync (the physical limit); *torch.save*: model + optimizer state dicts in one "
                      "file + fsync; *save_state*/*load_state*: hasten's (safetensors, RNG, manifest, fsync, atomic "
                      "rename; the load checks every file first). Loads may read the page cache (caches dropped "
                      "only when run as root)."), ""]
            rows = [[r["name"], f(r["seconds"], 2, " s"), f(r["mb"], 0, " MB"), f(r["mb_s"], 0, " MB/s")] for r in timed]
            lines += table(["operation", "time", "size", "throughput"], rows)
        if ratios:
            lines += [(f"save_state / disk limit {ratios['save_vs_disk']:.2f}x; save_state / torch.save "
                      f"{ratios['save_vs_torch_save']:.2f}x; load_state / torch.load {ratios['load_vs_torch_load']:.2f}x; "
                      f"peak RSS {ratios['peak_rss_mib']:.0f} MiB."), ""]
        restart = next((r for r in ckpt if r["name"] == "restart"), None)
        if restart:
            lines += table([f"2 processes, `hasten launch` (median of {restart['rounds']})", "seconds"], [
                ["SIGTERM to the launcher → all ranks agree, save, exit 75", f(restart["preemption_exit_s"], 2)],
                ["launch → first training step, fresh run", f(restart["fresh_first_step_s"], 2)],
                ["launch → first resumed step, after the preemption", f(restart["resumed_first_step_s"], 2)],
            ])
        cost = next((r for r in ckpt if r["name"] == "checksum_cost"), None)
        if cost:
            caches = [kind for kind in ("hot", "cold") if kind in cost]
            lines += [(f"**Checksum cost** ({cost['algorithm']} of every file in the manifest; `--checksums`): "
                       f"save_state + load_state of {cost['mb']:.0f} MB with / without the hashes, median of "
                       f"{cost['rounds']}: " + "; ".join(
                           f"{kind} cache {cost[kind]['ratio']:.2f}x (save {cost[kind]['save_on_s']:.2f} / "
                           f"{cost[kind]['save_off_s']:.2f} s, load {cost[kind]['load_on_s']:.3f} / "
                           f"{cost[kind]['load_off_s']:.3f} s)" for kind in caches) + " (goal ≤ 1.10x). Hashes in "
                       "memory: " + ", ".join(f"{k} {v:.0f} MB/s" for k, v in cost["hash_mb_s"].items()) +
                       f"; the disk writes {cost['disk_mb_s']:.0f} MB/s with fsync. No peer checksums its checkpoints."),
                      ""]

    # faults
    faults = by(records, "faults")
    if faults:
        shown = ["hasten", *[p for p in peers if any(r.get("framework") == p for r in faults)]]
        lines += ["## Faults, side by side", "",
                  ("One run per case on 2 processes (`benchmarks/faults.py`), each framework started by its own "
                  "launcher (`hasten launch`, `accelerate launch`, torchrun for Fabric), with the same training "
                  "(dropout, shuffling, AdamW, a scheduler, accumulation 2, a checkpoint every 4 steps) written "
                  "each framework's documented way. hasten and Accelerate run the very same file "
                  "(`_faults_train.py`, only the imports differ; resumption as Accelerate's checkpointing guide "
                  "writes it, with `use_seedable_sampler=True`, its setting for a shuffle that resumes "
                  "reproducibly); Fabric's version is `_faults_train_fabric.py` (`fabric.save`/`fabric.load` of "
                  "model, optimizer, scheduler and step counter, as its guide shows: no RNG states). *Exact resume*: rank 1 SIGKILLed "
                  "after step 7, the run started again, losses (float.hex) and final parameters compared with an "
                  "uninterrupted run; then the same with a model without dropout, so that no random number is drawn "
                  "after the restore but the shuffle's. *Preemption*: SIGTERM to the launcher after step 5. *Hang*: rank 0 waits in "
                  "a barrier while rank 1 is in a gather (the default 30-minute timeout); the peers are killed "
                  "after a fixed limit. For hasten the test suite establishes the same "
                  "(tests/test_resume.py, tests/test_launch_signals.py, tests/test_watchdog.py)."), ""]
        rows = []
        for name in names(faults):
            row = [name]
            for fw in shown:
                r = lookup(records, "faults", name, fw)
                row.append("—" if r is None else f"{'**yes**' if r['holds'] else '**no**'}: {r['outcome']}")
            rows.append(row)
        lines += table(["behaviour (does it hold?)", *[{"hasten": "hasten", **peer_title}[fw] for fw in shown]], rows)

    # notes and raw output
    lines += ["## How the peers were run", "",
              "- **Accelerate**: in the speed benchmark its loop runs in the same 2 processes as the raw and hasten "
              "loops: `Accelerator(cpu=True, mixed_precision=..., gradient_accumulation_steps=...)` adopts the gloo "
              "group the raw loop created (Accelerate only turns multi-process on for CPUs with `cpu=True`; "
              "without it each rank trains alone), `prepare(model, optimizer, loader)`, `accumulate`, `backward`. "
              "Accelerate keeps its state in singletons, so its per-Accelerator state is reset before each new "
              "Accelerator (as its own tests do); hasten's Accelerator and Accelerate's coexist in one process "
              "with the same process group, and give the same parameters (table above). "
              "Launch and faults use `accelerate launch` with flags only (no config file)."
              if "accelerate" in peers else "- **Accelerate**: not installed in this environment; not measured.",
              "- **Lightning Fabric**: in the same processes too: `Fabric(accelerator='cpu', devices=2, "
              "strategy='ddp', precision='32-true' or 'bf16-mixed')`, `launch()` (started by a launcher already: "
              "it adopts the group), `setup`, `setup_dataloaders`, accumulation with `no_backward_sync` and a step "
              "every N batches, `fabric.backward`. Faults start it with torchrun."
              if "fabric" in peers else "- **Lightning Fabric**: not installed in this environment; not measured.",
              ""]
    if runs:
        lines += ["## Console output", ""]
        for r in runs:
            output, left_out = quiet(r.get("output", ""))
            state = "timed out, killed" if r.get("exit") is None else f"exit {r['exit']}"
            lines += [(f"<details><summary><code>{r['name']} {' '.join(r.get('args', []))}</code>: {state}, "
                      f"{r['seconds']:.0f} s</summary>"), "", "```"] + output + ["```", ""]
            if left_out:
                lines += [(f"({left_out} lines of warnings left out: Python warnings and DeepSpeed's \"Setting "
                          "accelerator to CPU\"; results.jsonl has each once.)"), ""]
            lines += ["</details>", ""]
    return "\n".join(lines).rstrip() + "\n"


def _measure_key(r: dict) -> str:
    return "cpu_ratio" if r.get("verdict_on") == "cpu_ratio" else "wall_ratio"


def _measure(r: dict) -> float | None:
    """The ratio a steps record's verdict uses."""
    if r.get("verdict_on") == "max(wall_ratio, cpu_ratio)":
        return max(x for x in (r.get("wall_ratio"), r.get("cpu_ratio")) if x is not None)
    return r.get(_measure_key(r))


# ---------------------------------------------------------------------------- results.png
def chart(records: list[dict], path: Path, quick: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"hasten": "#1f77b4", "accelerate": "#ff7f0e", "fabric": "#9467bd"}
    labels = {"hasten": "hasten", "accelerate": "Accelerate", "fabric": "Lightning Fabric"}
    steps = by(records, "steps")
    groups = [n for n in names(steps) if lookup(records, "steps", n, "hasten")]
    fixed = []  # (label, {framework: speed ratio}, target as a speed ratio)
    for fw, name in (("hasten", "from hasten import Accelerator"), ("accelerate", "from accelerate import Accelerator"),
                     ("fabric", "from lightning.fabric import Fabric")):
        r = lookup(records, "import", name, fw)
        if r:
            if not fixed or fixed[-1][0] != "import\n(vs import torch)":
                fixed.append(("import\n(vs import torch)", {}, 1 / TARGETS["import"]))
            fixed[-1][1][fw] = 1 / r["ratio"]
    r = lookup(records, "launch", "hasten launch", "hasten")
    if r:
        fixed.append(("launch, raw script\n(vs torchrun)", {"hasten": 1 / r["ratio"]}, 1 / TARGETS["launch"]))
    launch = {fw: lookup(records, "launch", name, fw) for fw, name in
              (("hasten", "hasten launch + hasten.Accelerator"), ("accelerate", "accelerate launch + accelerate.Accelerator"))}
    if launch["hasten"]:
        fixed.append(("launch + Accelerator\n(vs torchrun, raw)", {fw: 1 / r["ratio"] for fw, r in launch.items() if r},
                      1 / TARGETS["launch"]))
    gathers = {fw: lookup(records, "gather", "all-gather of 1M floats", fw) for fw in FRAMEWORKS}
    if gathers["hasten"]:
        fixed.append(("gather 1M floats\n(vs all-gather)", {fw: 1 / r["ratio"] for fw, r in gathers.items() if r},
                      1 / TARGETS["gather"]))

    fig, axes = plt.subplots(2, 1, figsize=(13, 10), gridspec_kw={"height_ratios": [1.25, 1]})
    title = "hasten and peers relative to raw PyTorch, 2 processes (higher is better; 1.0 = raw)"
    fig.suptitle(title + ("  [--quick: noisy]" if quick else ""), fontsize=13)

    def bars(ax, group_labels, values, targets, target_label):
        """One group per label, its bars (the frameworks measured there) centred on it; a target segment each."""
        width = 0.8 / max(1, max(len(entry) for entry in values))
        top, labelled = 1.0, set()
        for g, entry in enumerate(values):
            present = [fw for fw in FRAMEWORKS if fw in entry]
            for i, fw in enumerate(present):
                x, y = g + (i - (len(present) - 1) / 2) * width, entry[fw]
                ax.bar(x, y, width * 0.92, color=colors[fw], label=None if fw in labelled else labels[fw])
                labelled.add(fw)
                inside = y > 0.2
                ax.text(x, y - 0.02 if inside else y + 0.02, f"{y:.2f}", ha="center", va="top" if inside else "bottom",
                        fontsize=8, color="white" if inside else "black", fontweight="bold")
                top = max(top, y)
        ax.axhline(1.0, color="black", linewidth=1, label="raw PyTorch = 1.0")
        for g, target in enumerate(targets):
            ax.hlines(target, g - 0.45, g + 0.45, colors="red", linestyles="dashed", linewidth=1.5,
                      label=target_label if g == 0 else None)
        ax.set_xticks(range(len(group_labels)))
        ax.set_xticklabels(group_labels, fontsize=8)
        ax.set_ylim(0, top + 0.3)
        ax.set_xlim(-0.6, len(group_labels) - 0.4)
        ax.legend(fontsize=8, loc="upper center", ncol=5, framealpha=0.95)
        ax.grid(axis="y", alpha=0.3)

    if groups:
        values = []
        for name in groups:
            entry = {}
            for fw in FRAMEWORKS:
                r = lookup(records, "steps", name, fw)
                if r:
                    h = lookup(records, "steps", name, "hasten")
                    # the hasten record says which measure its verdict uses; the peers are shown by the same one
                    value = r.get(_measure_key(h)) if h.get("verdict_on") != "max(wall_ratio, cpu_ratio)" else _measure(r)
                    if value is not None:
                        entry[fw] = value
            values.append(entry)
        bars(axes[0], [n.replace(" acc=", "\nacc=") for n in groups], values, [TARGETS["steps"]] * len(groups),
             "target (hasten ≥ 0.99)")
        axes[0].set_ylabel("steps/s ratio to raw")
        axes[0].set_title("Training steps/s (DDP: main-thread CPU time; FSDP2: wall clock; ZeRO: better of both)",
                          fontsize=10)
    else:
        axes[0].set_axis_off()
    if fixed:
        bars(axes[1], [g[0] for g in fixed], [g[1] for g in fixed], [g[2] for g in fixed],
             "target for hasten (1/1.05; gather 1/1.10)")
        axes[1].set_ylabel("speed ratio (baseline time / time)")
        axes[1].set_title("Fixed costs as speed (baseline time / time): import vs `import torch`, launch to exit vs "
                          "torchrun of the raw script, gather vs raw all_gather_into_tensor", fontsize=10)
    else:
        axes[1].set_axis_off()
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------- main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="every script with --quick (minutes, noisier)")
    parser.add_argument("--only", nargs="+", metavar="SCRIPT", help="run only these scripts (e.g. faults.py)")
    parser.add_argument("--output-dir", type=Path, default=HERE, help="where RESULTS.md, results.png and "
                        "results.jsonl go (default: benchmarks/)")
    parser.add_argument("--from-results", type=Path, metavar="JSONL", help="write the report from this results "
                        "file without running anything")
    args = parser.parse_args()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(HERE))
    from _results import ENV, record

    if args.from_results:
        records = load(args.from_results)
        meta = next((r for r in records if r["section"] == "_meta"), {})
        quick = bool(meta.get("quick"))
    else:
        quick = args.quick
        chosen = [b for b in BENCHMARKS if not args.only or b[0] in args.only]
        unknown = set(args.only or ()) - {b[0] for b in BENCHMARKS}
        if unknown:
            parser.error(f"unknown scripts: {', '.join(sorted(unknown))}")
        handle, path = tempfile.mkstemp(prefix="hasten-bench-", suffix=".jsonl")
        os.close(handle)
        os.environ[ENV] = path
        info = machine()
        peers = {p: importlib.util.find_spec(module) is not None for p, module in PEERS.items()}
        skipped = {b[0]: f"{b[3]} is not installed" for b in chosen if b[3] and importlib.util.find_spec(b[3]) is None}
        interpreter = sys.executable
        command = f"{interpreter} benchmarks/run_all.py" + "".join(f" {a}" for a in sys.argv[1:])
        record("_meta", "run", **info, peers=peers, quick=quick, command=command, skipped=skipped,
               only=args.only)
        print(f"hasten benchmarks{' (quick)' if quick else ''}: {len(chosen) - len(skipped)} scripts; peers: "
              + ", ".join(f"{p} {'installed' if ok else 'NOT installed'}" for p, ok in peers.items())
              + f"; results -> {path}", flush=True)
        started = time.monotonic()
        runnable = [b for b in chosen if b[0] not in skipped]
        for index, (script, full_limit, quick_limit, _) in enumerate(runnable, 1):
            script_args = ["--quick"] if quick else []
            code, seconds, output = run_script(script, script_args, quick_limit if quick else full_limit, index,
                                               len(runnable))
            output, repeats = once(output)  # DeepSpeed's runs repeat one FutureWarning thousands of times
            record("_run", script, args=script_args, exit=code, seconds=seconds, output=output,
                   repeated_warning_lines_dropped=repeats)
        for script, why in skipped.items():
            print(f"(skipped {script}: {why})", flush=True)
        print(f"\nall scripts done in {(time.monotonic() - started) / 60:.1f} min", flush=True)
        records = load(Path(path))
        previous = args.output_dir / "results.jsonl"
        if args.only and previous.exists():  # the scripts not run keep their figures from the last run
            records = merge(records, load(previous), {b[0] for b in runnable})
            with open(path, "w") as out:
                out.writelines(json.dumps(r) + "\n" for r in records)
        shutil.copyfile(path, args.output_dir / "results.jsonl")
        os.unlink(path)
    (args.output_dir / "RESULTS.md").write_text(render(records, quick))
    chart(records, args.output_dir / "results.png", quick)
    print(f"wrote {args.output_dir / 'RESULTS.md'} and {args.output_dir / 'results.png'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
