"""hasten vs hand-written PyTorch DDP: per-step overhead, parameters, gather, import time.

Run it from the repository root (it launches itself on 2 processes):

    python benchmarks/overhead.py            # full run, a few minutes on 2 cores
    python benchmarks/overhead.py --quick    # fewer rounds
    python benchmarks/overhead.py --liveness # only the liveness heartbeat's cost, in more rounds
    python benchmarks/overhead.py --collectives  # only the gather and small-collective section

Both training loops run in the same 2 processes, their steps interleaved
(one step of each in turn, each timed alone), so machine noise hits both
alike; the reported ratio is the median over rounds of (hasten steps/s) /
(raw steps/s). The raw loop is what a careful user writes by hand:
DistributedSampler, DDP, `no_sync` on accumulation steps, `torch.autocast`.

Targets: steps/s ratio >= 0.99; fp32 parameters equal to the raw loop's
(max |diff| <= 1e-6); gather of 1M floats <= 1.1x raw all-gather; reduce of
1 float <= 1.2x raw all-reduce (shape check included); `from hasten import
Accelerator` <= 1.05x `import torch`. The liveness
heartbeat (a thread of every launched process, so it runs under both
loops) is measured apart: the raw loop's speed with it on and off.

Peers, when installed in the same environment (never needed by hasten): a
loop written for Hugging Face Accelerate (`accelerate.Accelerator`, its
prepare/accumulate/backward) and one written for Lightning Fabric
(`fabric.setup`, `setup_dataloaders`, `no_backward_sync`, `fabric.backward`)
train the same model on the same data with the same accumulation and
precision, in the same processes and the same alternating rounds, so their
ratios to the raw loop are measured exactly like hasten's. Their import time
and gather are measured alongside too.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import importlib.util
import resource
import statistics
import time

from _launch import launch_self
from _overhead_parts import compare_imports, compare_small_collective, rotations, run_loop
from _results import record


# ---------------------------------------------------------------------------- models and data
def build(kind: str, seed: int):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    if kind == "mlp":
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
        x = torch.randn(32768, 32)
        y = x[:, :1] * 2 - x[:, 1:2]
        batch = 32
    else:  # a small transformer encoder for sequence regression
        layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0, batch_first=True)
        model = nn.Sequential(nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False), nn.Flatten(), nn.Linear(64 * 16, 1))
        x = torch.randn(1024, 16, 64)
        y = x.mean(dim=(1, 2)).unsqueeze(1)
        batch = 8
    return model, torch.utils.data.TensorDataset(x, y), batch


def raw_loop(kind: str, steps: int, accumulation: int, precision: str, seed: int = 0):
    """The hand-written DDP baseline, as a step generator (see `run_loop`); returns the model."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    model, dataset, batch = build(kind, seed)
    ddp = DDP(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    sampler = DistributedSampler(dataset, shuffle=False)
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler)
    dtype = torch.bfloat16 if precision == "bf16" else None
    yield  # set up
    for step, (x, y) in enumerate(loader):
        if step == steps:
            break
        sync = (step + 1) % accumulation == 0
        with contextlib.nullcontext() if sync else ddp.no_sync():
            with torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext():
                out = ddp(x)
            loss = torch.nn.functional.mse_loss(out.float(), y) / accumulation
            loss.backward()
        if sync:
            optimizer.step()
            optimizer.zero_grad()
        yield
    return model


def hasten_loop(kind: str, steps: int, accumulation: int, precision: str, seed: int = 0, preemption: bool = False):
    """The same loop written for hasten, as a step generator; returns the model.

    With `preemption`, automatic checkpoint naming is on: SIGTERM/SIGUSR1 are watched and the
    processes check for an agreed stop at batch boundaries (what this costs is what is measured).
    """
    import tempfile

    from hasten import Accelerator, ProjectConfiguration

    project = ProjectConfiguration(tempfile.gettempdir(), automatic_checkpoint_naming=True) if preemption else None
    accelerator = Accelerator(mixed_precision=precision, gradient_accumulation_steps=accumulation, project_config=project)
    model = yield from accelerator_steps(accelerator, kind, steps, seed)
    accelerator._boundary_watch.close()  # give the signals back before the next loop's Accelerator
    return model


def accelerator_steps(accelerator, kind: str, steps: int, seed: int):
    """The training loop as written for Accelerate's API, which hasten keeps: the same lines run for both."""
    import torch
    from torch.utils.data import DataLoader

    model, dataset, batch = build(kind, seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(dataset, batch_size=batch)
    ddp, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    yield  # set up
    for step, (x, y) in enumerate(loader):
        if step == steps:
            break
        with accelerator.accumulate(ddp):
            out = ddp(x)
            loss = torch.nn.functional.mse_loss(out.float(), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        yield
    return accelerator.unwrap_model(ddp)


def accelerate_loop(kind: str, steps: int, accumulation: int, precision: str, seed: int = 0):
    """The same loop written for Hugging Face Accelerate, as a step generator; returns the model.

    It adopts the process group the raw loop created (Accelerate inits one only when none exists).
    `cpu=True` because Accelerate only turns multi-process on for CPUs when asked to (without it, on
    a machine with no GPU, every rank would train alone). Like hasten's loop, each call builds a fresh
    Accelerator; Accelerate keeps its state in singletons, so it is reset first (what its own tests do),
    keeping the process-level state (the group) and dropping the per-Accelerator one (precision, accumulation).
    """
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, mixed_precision=precision, gradient_accumulation_steps=accumulation)
    return (yield from accelerator_steps(accelerator, kind, steps, seed))


def make_fabric(precision: str):
    """A Lightning Fabric on the CPUs of this launch; it adopts the existing process group."""
    import logging

    import torch.distributed as dist

    try:
        from lightning.fabric import Fabric
    except ImportError:
        from lightning_fabric import Fabric
    for name in ("lightning", "lightning.fabric", "lightning.pytorch", "lightning_fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)  # "Using bfloat16 Automatic Mixed Precision" per loop
    fabric = Fabric(accelerator="cpu", devices=dist.get_world_size(), num_nodes=1, strategy="ddp",
                    precision="bf16-mixed" if precision == "bf16" else "32-true")
    fabric.launch()  # started by a launcher already: sets up the strategy, starts nothing
    return fabric


def fabric_loop(kind: str, steps: int, accumulation: int, precision: str, seed: int = 0):
    """The same loop written for Lightning Fabric (its documented accumulation: `no_backward_sync`, step every N), as a step generator."""
    import torch
    from torch.utils.data import DataLoader

    fabric = make_fabric(precision)
    model, dataset, batch = build(kind, seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(DataLoader(dataset, batch_size=batch))  # adds the DistributedSampler
    yield  # set up
    for step, (x, y) in enumerate(loader):
        if step == steps:
            break
        sync = (step + 1) % accumulation == 0
        with fabric.no_backward_sync(model, enabled=not sync):
            out = model(x)
            loss = torch.nn.functional.mse_loss(out.float(), y) / accumulation
            fabric.backward(loss)
        if sync:
            optimizer.step()
            optimizer.zero_grad()
        yield
    return model.module


def peer_loops() -> dict:
    """The peers installed in this environment: name -> loop (empty when none is; hasten never needs them)."""
    loops = {}
    if importlib.util.find_spec("accelerate") is not None:
        loops["accelerate"] = accelerate_loop
    if importlib.util.find_spec("lightning") is not None or importlib.util.find_spec("lightning_fabric") is not None:
        loops["fabric"] = fabric_loop
    return loops


PRECISION_NAMES = {"no": "fp32", "bf16": "bf16"}


# ---------------------------------------------------------------------------- measurements (inside the 2 processes)
def compare_steps(kind: str, accumulation: int, precision: str, rounds: int, steps: int, preemption: bool = False) -> float:
    """Median over rounds of hasten/raw speed, by wall clock and by main-thread CPU time.

    In a round every loop is set up, then their steps interleave: one step
    of each loop in turn (the order rotating every step), each timed alone.
    Drift of the machine's speed, which on a shared VM is seconds long, then
    falls on all loops alike. Wall clock is what users feel; the main
    thread's CPU time is what a framework's Python adds per step, and is
    steadier still. The verdict uses the CPU-time ratio.
    """
    import torch.distributed as dist

    hasten = functools.partial(hasten_loop, preemption=preemption)
    # the peers run in the same rounds (not next to hasten's preemption variant: they have no equivalent)
    loops = {"raw": raw_loop, "hasten": hasten, **({} if preemption else peer_loops())}
    wall_ratios = {name: [] for name in loops if name != "raw"}
    cpu_ratios = {name: [] for name in wall_ratios}
    rates = {name: [] for name in loops}
    for loop in loops.values():  # warm-up every path
        run_loop(loop(kind, 8, accumulation, precision))
    for round_index in range(rounds):
        gc.collect()
        running = {name: loop(kind, steps, accumulation, precision) for name, loop in loops.items()}
        for name in rotations(list(loops), round_index):
            next(running[name])  # set up, untimed
        timings = {name: [0.0, 0.0] for name in loops}
        dist.barrier()
        for step in range(steps):
            for name in rotations(list(loops), round_index + step):
                wall_start, cpu_start = time.perf_counter(), time.thread_time()
                next(running[name])
                timings[name][1] += time.thread_time() - cpu_start
                timings[name][0] += time.perf_counter() - wall_start
        for steps_of_a_loop in running.values():
            run_loop(steps_of_a_loop)
        raw_wall, raw_cpu = timings["raw"]
        for name, (wall_seconds, cpu_seconds) in timings.items():
            rates[name].append(steps / wall_seconds)
            if name != "raw":
                wall_ratios[name].append(raw_wall / wall_seconds)
                cpu_ratios[name].append(raw_cpu / cpu_seconds)
    wall, cpu = statistics.median(wall_ratios["hasten"]), statistics.median(cpu_ratios["hasten"])
    low, _, high = statistics.quantiles(wall_ratios["hasten"], n=4)
    label = kind + (" +preempt" if preemption else "")
    if dist.get_rank() == 0:
        print(
            f"{label:<20} acc={accumulation} {precision:<4}  raw {statistics.median(rates['raw']):6.1f} steps/s  "
            f"hasten {statistics.median(rates['hasten']):6.1f} steps/s  wall ratio {wall:.3f} "
            f"(quartiles {low:.2f}-{high:.2f})  CPU ratio {cpu:.3f}  {'ok' if cpu >= 0.99 else 'BELOW 0.99'}",
            flush=True,
        )
        for name, ratios in wall_ratios.items():
            peer_wall, peer_cpu = statistics.median(ratios), statistics.median(cpu_ratios[name])
            peer_low, _, peer_high = statistics.quantiles(ratios, n=4)
            if name != "hasten":
                print(f"{'  same, ' + name:<20} acc={accumulation} {precision:<4}  raw {statistics.median(rates['raw']):6.1f} "
                      f"steps/s  {name} {statistics.median(rates[name]):6.1f} steps/s  wall ratio {peer_wall:.3f} "
                      f"(quartiles {peer_low:.2f}-{peer_high:.2f})  CPU ratio {peer_cpu:.3f}  (peer)", flush=True)
            record("steps", f"DDP {label} acc={accumulation} {PRECISION_NAMES[precision]}", framework=name, engine="DDP",
                   model=kind, accumulation=accumulation, precision=PRECISION_NAMES[precision], preemption=preemption,
                   rounds=rounds, steps_per_round=steps, raw_steps_s=statistics.median(rates["raw"]),
                   steps_s=statistics.median(rates[name]), wall_ratio=peer_wall, wall_q1=peer_low, wall_q3=peer_high,
                   cpu_ratio=peer_cpu, verdict_on="cpu_ratio",
                   ok=(peer_cpu >= 0.99) if name == "hasten" else None)
    return cpu


def compare_parameters(kind: str, accumulation: int) -> float:
    import torch.distributed as dist

    steps = 48
    raw_model = run_loop(raw_loop(kind, steps, accumulation, "no", seed=1))
    hasten_model = run_loop(hasten_loop(kind, steps, accumulation, "no", seed=1))
    untrained_model = run_loop(raw_loop(kind, 0, accumulation, "no", seed=1))
    diff = max((a - b).abs().max().item() for a, b in zip(raw_model.parameters(), hasten_model.parameters()))
    moved = max((a - b).abs().max().item() for a, b in zip(raw_model.parameters(), untrained_model.parameters()))
    if dist.get_rank() == 0:
        verdict = "ok" if diff <= 1e-6 else "ABOVE 1e-6"
        print(f"{kind:<12} acc={accumulation} fp32  max |param raw - param hasten| = {diff:.2e} "
              f"(training moved them by up to {moved:.2e})  {verdict}", flush=True)
        record("parameters", f"{kind} acc={accumulation} fp32", framework="hasten", max_diff=diff, moved=moved,
               ok=diff <= 1e-6)
    # the peers' loops must be the same training too (else their speed would not be comparable)
    for name, loop in peer_loops().items():
        peer_model = run_loop(loop(kind, steps, accumulation, "no", seed=1))
        peer_diff = max((a - b).abs().max().item() for a, b in zip(raw_model.parameters(), peer_model.parameters()))
        if dist.get_rank() == 0:
            print(f"{kind:<12} acc={accumulation} fp32  max |param raw - param {name}| = {peer_diff:.2e}  (peer)", flush=True)
            record("parameters", f"{kind} acc={accumulation} fp32", framework=name, max_diff=peer_diff, moved=moved,
                   ok=None)
    assert moved > 1e-4, "the parameter check must train for real"
    return diff


def compare_gather(rounds: int, with_peers: bool = True) -> float:
    import torch
    import torch.distributed as dist

    from hasten.utils import gather

    tensor = torch.randn(1_000_000)
    raw_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gathers = {"raw": None, "hasten": gather}
    peers = peer_loops() if with_peers else {}  # a peer's gather needs its loop's state, set up by the steps above
    if "accelerate" in peers:  # the state of the loops above (multi-CPU) is still set up
        from accelerate.utils import gather as accelerate_gather

        gathers["accelerate"] = accelerate_gather
    if "fabric" in peers:
        gathers["fabric"] = make_fabric("no").all_gather  # returns (world, n): compared after a reshape
    times = {name: [] for name in gathers}
    results = {}
    for round_index in range(rounds):
        # Rotate which goes first: the second collective of a pair starts with the ranks less aligned.
        for which in rotations(list(gathers), round_index):
            dist.barrier()
            start = time.perf_counter()
            if which == "raw":
                out = torch.empty(dist.get_world_size() * tensor.numel())
                raw_gather(out, tensor)
            else:
                out = gathers[which](tensor)
            times[which].append(time.perf_counter() - start)
            results[which] = out
    raw_times, hasten_times = times["raw"], times["hasten"]
    out, mine = results["raw"], results["hasten"]
    assert torch.equal(out, mine)
    ratio = statistics.median(hasten_times) / statistics.median(raw_times)
    if dist.get_rank() == 0:
        print(f"gather 1M floats   raw {statistics.median(raw_times) * 1e3:7.2f} ms   hasten "
              f"{statistics.median(hasten_times) * 1e3:7.2f} ms   ratio {ratio:.3f}  "
              f"{'ok' if ratio <= 1.1 else 'ABOVE 1.1'}", flush=True)
    for name in gathers:
        if name == "raw":
            continue
        assert torch.equal(out, results[name].reshape(-1)), name
        peer_ratio = statistics.median(times[name]) / statistics.median(raw_times)
        if dist.get_rank() == 0:
            if name != "hasten":
                print(f"gather 1M floats   raw {statistics.median(raw_times) * 1e3:7.2f} ms   {name} "
                      f"{statistics.median(times[name]) * 1e3:7.2f} ms   ratio {peer_ratio:.3f}  (peer)", flush=True)
            record("gather", "all-gather of 1M floats", framework=name, rounds=rounds,
                   raw_ms=statistics.median(raw_times) * 1e3, ms=statistics.median(times[name]) * 1e3, ratio=peer_ratio,
                   ok=(peer_ratio <= 1.1) if name == "hasten" else None)
    compare_small_collective(rounds)
    return ratio


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    # The raw baseline creates the process group itself; hasten adopts it.
    dist.init_process_group("gloo")
    if args.liveness or args.collectives:  # one section alone
        if args.liveness:
            compare_heartbeat(rounds=40, steps=500)
            compare_heartbeat(rounds=40, steps=500, control=True)
        else:
            if dist.get_rank() == 0:
                print("-- collectives", flush=True)
            compare_gather(rounds=15 if args.quick else 60, with_peers=False)
        dist.barrier()
        dist.destroy_process_group()
        return
    # Many short paired rounds: this VM's speed drifts by +-30% within seconds,
    # and pairing adjacent runs cancels drift slower than one round.
    rounds = {"mlp": 10 if args.quick else 40, "transformer": 6 if args.quick else 16}
    steps = {"mlp": 80, "transformer": 20}
    if dist.get_rank() == 0:
        print("-- steps/s, 2 processes (gloo); ratio = median over alternating paired rounds of hasten/raw", flush=True)
    for kind, precision in (("mlp", "no"), ("transformer", "bf16")):
        for accumulation in (1, 4):
            compare_steps(kind, accumulation, precision, rounds[kind], steps[kind])
    # automatic checkpoint naming on: preemption signals watched, stop agreed at batch boundaries
    compare_steps("mlp", 1, "no", rounds["mlp"], steps["mlp"], preemption=True)
    if dist.get_rank() == 0:
        print("-- fp32 parameters after the same training, raw DDP vs hasten", flush=True)
    for kind in ("mlp", "transformer"):
        for accumulation in (1, 4):
            compare_parameters(kind, accumulation)
    if dist.get_rank() == 0:
        print("-- collectives", flush=True)
    compare_gather(rounds=15 if args.quick else 60)
    if dist.get_rank() == 0:
        print("-- liveness: the heartbeat thread on and off (steps/s of the raw loop)", flush=True)
    compare_heartbeat(rounds=8 if args.quick else 24, steps=500)  # 500: one epoch of the mlp data
    compare_heartbeat(rounds=8 if args.quick else 24, steps=500, control=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if dist.get_rank() == 0:
        print(f"peak RSS of rank 0 (both loops): {peak:.0f} MiB", flush=True)
        record("memory", "overhead.py, rank 0 (all loops, DDP)", peak_mib=peak, loops=["raw", "hasten", *peer_loops()])
    dist.barrier()
    dist.destroy_process_group()


def compare_heartbeat(rounds: int, steps: int, control: bool = False) -> float:
    """What the liveness heartbeat costs a training loop: the raw DDP loop with the heartbeat thread on and off.

    The thread is process-wide, so it cannot alternate step by step: rounds
    of `steps` steps (about a second: a beat each) alternate on/off,
    AB BA ..., on both processes together; the ratio is the median of
    (steps/s on) / (steps/s off) over pairs of adjacent rounds. The direct
    cost of one beat is timed too (one small file replaced, once a second).
    With `control`, "on" rounds start no heartbeat: the same protocol's
    noise floor (an A/A comparison).
    """
    import tempfile

    import torch.distributed as dist

    from hasten.process import heartbeat

    rank = dist.get_rank()
    directory = tempfile.mkdtemp(prefix="hasten-bench-heartbeat-")
    identity = {"rank": rank, "pid": 0, "host": "bench"}
    path = heartbeat.heartbeat_path(directory, rank)
    start = time.perf_counter()
    for number in range(2000):
        heartbeat._beat_once(path, identity, number)
    beat_us = (time.perf_counter() - start) / 2000 * 1e6
    launched = heartbeat.running()
    heartbeat.stop()  # the one `hasten launch` started: toggled below instead
    run_loop(raw_loop("mlp", 8, 1, "no"))  # warm-up
    rates: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}  # process CPU seconds per step (every thread: the beats too)
    for round_index in range(2 * rounds):
        on = (round_index % 4) in (0, 3)  # on off off on on off off on ...: each pair has both, first one alternating
        if on and not control:
            heartbeat.start(directory, rank=rank)
        loop = raw_loop("mlp", steps, 1, "no")
        next(loop)  # set up, untimed
        dist.barrier()
        begin, cpu_begin = time.perf_counter(), time.process_time()
        run_loop(loop)
        rates[on].append(steps / (time.perf_counter() - begin))
        cpu[on].append((time.process_time() - cpu_begin) / steps)
        heartbeat.stop()
    ratios = [rates[True][i] / rates[False][i] for i in range(rounds)]
    ratio = statistics.median(ratios)
    cpu_ratio = statistics.median([cpu[False][i] / cpu[True][i] for i in range(rounds)])
    low, _, high = statistics.quantiles(ratios, n=4)
    if launched:
        heartbeat.start()  # as the launcher set it up
    if rank == 0 and control:
        print(f"  control (A/A: no heartbeat in either round of a pair): wall ratio {ratio:.3f} "
              f"(quartiles {low:.2f}-{high:.2f})  CPU ratio {cpu_ratio:.3f}", flush=True)
    elif rank == 0:
        print(f"liveness heartbeat  one beat {beat_us:.1f} us once a second ({beat_us / 1e4:.4f}% of a core); raw DDP loop "
              f"{statistics.median(rates[False]):.1f} steps/s without, {statistics.median(rates[True]):.1f} with: "
              f"wall ratio {ratio:.3f} (quartiles {low:.2f}-{high:.2f})  CPU ratio {cpu_ratio:.3f}", flush=True)
    if rank == 0:
        record("liveness", "heartbeat thread, raw DDP mlp loop" + (" (A/A control)" if control else ""),
               framework="hasten", rounds=rounds, steps_per_round=steps, beat_us=beat_us, ratio=ratio, q1=low, q3=high,
               cpu_ratio=cpu_ratio)
    return ratio


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds (noisier)")
    parser.add_argument("--liveness", action="store_true", help="only the heartbeat's cost, in more rounds")
    parser.add_argument("--collectives", action="store_true", help="only the gather and small-collective costs")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    if args.liveness:
        return launch_self(__file__, "--worker", "--liveness")
    if args.collectives:
        return launch_self(__file__, "--worker", "--collectives", *(["--quick"] if args.quick else []))
    compare_imports(repeats=3 if args.quick else 7)
    return launch_self(__file__, "--worker", *(["--quick"] if args.quick else []))


if __name__ == "__main__":
    raise SystemExit(main())
