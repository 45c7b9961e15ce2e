"""How benchmarks/run_all.py turns the recorded figures into RESULTS.md and results.png (no running here).

`render` writes the report from the JSON records the benchmark scripts
appended (one section per script), `chart` draws the ratios; `quiet` and
`once` keep the scripts' console output readable.

Example:
    >>> table(["a", "b"], [["1", "2"]])
    ['| a | b |', '|---|---|', '| 1 | 2 |', '']
"""

from __future__ import annotations

import re
from pathlib import Path

from _render_elastic import elastic_section, recovery_section
from _tables import f, table, verdict

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


# the formatting helpers (f, verdict, table) live in _tables.py, shared with _render_elastic.py


def _engine_and_accumulation(record: dict) -> str:
    return f"{record['engine']} x{record.get('accumulation', 1)}"


def by(records: list[dict], section: str) -> list[dict]:
    return [r for r in records if r["section"] == section]


def lookup(records: list[dict], section: str, name: str, framework: str) -> dict | None:
    for r in records:
        if r["section"] == section and r["name"] == name and r.get("framework") == framework:
            return r
    return None


def names(records: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["name"] for r in records))


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
    origins = meta.get("kept") or []
    origins = [origins] if isinstance(origins, dict) else origins  # one origin: results.jsonl written before 2026-11-26
    if meta.get("only") and any(o.get("scripts") for o in origins):
        lines += [f"**Partly rerun**: {', '.join(meta['only'])} on {meta.get('date')} (commit "
                  f"{meta.get('hasten_commit')}); " + "; ".join(
                      f"{', '.join(o['scripts'])} are from the run of {o['date']} (commit {o['commit']}, `{o['command']}`)"
                      for o in origins if o.get("scripts")) + ".", ""]
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
    stall = next((r for r in by(records, "checkpoint") if r["name"] == "async_save_stall" and "sync_stall_s" in r), None)
    if stall:
        rows.append([f"`save_state(async_save=True)`: what the next {stall['steps']} training steps lose, over a "
                     f"synchronous save ({stall['mb']:.0f} MB, {stall.get('threads', 1)} training thread)", "≤ 0.25",
                     f"{f(stall['ratio'], 3)} ({stall['async_stall_s']:.3f} s vs {stall['sync_stall_s']:.3f} s)",
                     verdict(stall["ratio"] <= 0.25)])
    faults = [r for r in by(records, "faults") if r.get("framework") == "hasten"]
    if faults:
        rows.append(["faults: exact resume, preemption, hang detection (below)", "all hold",
                     f"{sum(bool(r['holds']) for r in faults)} of {len(faults)} hold", verdict(all(r["holds"] for r in faults))])
    elastic = [r for r in by(records, "elastic") if r.get("shrink_s") is not None]
    if elastic:
        worst = max(r["shrink_s"] for r in elastic)
        rows.append(["elastic run: SIGKILL of a machine → first step on the survivor, every engine measured "
                     f"({', '.join(_engine_and_accumulation(r) for r in elastic)})", "≤ 60 s",
                     f"{worst:.1f} s (the slowest median)",
                     verdict(worst <= 60 and all(r["finished"] for r in elastic))])
    periodic = next((r for r in by(records, "elastic") if r["name"] == "periodic checkpoint cost" and "ratio" in r), None)
    if periodic:
        if "accounted_core_free" in periodic:  # the wall clock varies 10 % a round here: the steady accounted cost
            free, busy = periodic["accounted_core_free"], periodic["accounted_cores_busy"]
            rows.append(["periodic asynchronous checkpoints (every 20 steps, 2-process DDP): training time with / "
                         "without, accounted (a core free for the writer; every core busy training)", "≤ 1.01",
                         f"{f(free, 3)}; {f(busy, 3)} (wall clock {f(periodic['ratio'], 3)})",
                         verdict(busy <= 1.01) if busy <= 1.01 or free > 1.01
                         else "ok with a core free; **MISSED** with none"])
        else:
            rows.append(["periodic asynchronous checkpoints (every 20 steps, 2-process DDP): training time with / "
                         "without", "≤ 1.01", f(periodic["ratio"], 3), verdict(periodic["ratio"] <= 1.01)])
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
        if any("own part" in r["name"] for r in imports):
            lines += ["", "`import torch` ends with the collector's oldest generation over its threshold: the next few "
                      "hundred allocations after it, whatever makes them (an import, the script's first line), run a "
                      "full collection of torch's objects, the row \"the collection due\". The \"own part\" rows time "
                      "each statement in one interpreter after `import torch` with the collector off, their ratio "
                      "being (`import torch` + the part) / `import torch`.", ""]

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
                  f"loads: budget + largest block = {b['bound_mib']:.0f} MiB. *vs all in memory*: the fully loaded "
                  f"model's forward time over this way's, both in the same process, alternating, 5 rounds, medians "
                  f"(the `load_state_dict` row, the same model against itself, shows the noise). hasten writes the "
                  f"disk blocks in whole 2 MiB pieces so that the page cache keeps huge pages, which the forward maps "
                  f"at in-memory speed, on two threads; on this VM, which hands free memory back to its host, first "
                  f"use of huge pages costs the load time (0.9 s with 4 KiB pages, whose forward ran at 0.92-0.97)."),
                  ""]
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

    # fp8 (torchao, emulated on a CPU)
    fp8 = [r for r in by(records, "fp8") if "steps_s" in r]
    if fp8:
        same = next((r["equal"] for r in by(records, "fp8") if "equal" in r), None)
        lines += ["## fp8 (torchao float8, emulated)", "",
                  (f"An MLP of {fp8[0]['blocks']} residual blocks (d={fp8[0]['width']}) trained with AdamW on 1 CPU "
                   f"thread, fp8 Linear layers in torchao's emulation (`Float8LinearConfig(emulate=True)`), bf16 "
                   f"autocast; each variant in a fresh process, median of {fp8[0]['rounds']} alternating rounds. "
                   f"hasten's losses equal Accelerate's bit for bit: {'—' if same is None else ('yes' if same else '**no**')}."), ""]
        rows = [[r["name"], f(r["steps_s"], 2), f(r["vs_raw"], 3), f(r.get("vs_accelerate"), 3)] for r in fp8]
        lines += table(["variant", "steps/s", "vs raw", "vs Accelerate"], rows)

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
        stall = next((r for r in ckpt if r["name"] == "async_save_stall" and "sync_stall_s" in r), None)
        if stall:
            lines += [(f"**Asynchronous save** (`--async-save`), as a training loop feels it: the same {stall['steps']} "
                       f"training steps ({stall['none_s']:.2f} s) with no save before them, after `save_state` and after "
                       f"`save_state(async_save=True)` (its handle waited for after the steps), {stall['mb']:.0f} MB "
                       f"(151 MB model + AdamW), {stall.get('threads', 1)} training thread on this machine's cores, "
                       f"median of {stall['rounds']} alternating rounds: a synchronous save costs the loop "
                       f"{stall['sync_stall_s']:.3f} s, an asynchronous one {stall['async_stall_s']:.3f} s "
                       f"({stall['ratio']:.3f}x; goal ≤ 0.25x). Its writer runs at nice 19: it takes only the CPU "
                       "training leaves."), ""]
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

    lines += elastic_section(by(records, "elastic"))
    lines += recovery_section(by(records, "recovery"))

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
    gpu = Path(__file__).with_name("gpu_check.md")
    if gpu.is_file():  # the last GPU run (scripts/gpu_check.py on a lent machine): its table, as recorded there
        lines += ["## On a GPU", ""] + gpu.read_text().splitlines()[2:] + [""]
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

