"""hasten's DeepSpeed path vs a hand-written `deepspeed.initialize` loop: steps/s and peak memory.

Run it from the repository root (it launches itself on 2 processes):

    python benchmarks/deepspeed_steps.py            # ZeRO 2 and 3, accumulation 1 and 4
    python benchmarks/deepspeed_steps.py --quick    # fewer rounds

For each configuration both engines are built once (same model, same seed),
then they train in alternating short rounds (ABBA order) in the same 2
processes, so machine noise hits both alike. The ratio is the median over
rounds of (hasten steps/s) / (raw steps/s), by wall clock and by main-thread
CPU time (steadier on a shared VM). The raw loop is what a DeepSpeed user
writes: `engine(x)`, `engine.backward(loss)`, `engine.step()` per micro-batch.

Target: ratio >= 0.99. Peak RSS is printed per rank (both loops together).
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import time

from _launch import launch_self
from _results import record


def build(seed: int):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
    x = torch.randn(8192, 64)
    y = x[:, :1] * 2 - x[:, 1:2]
    return model, torch.utils.data.TensorDataset(x, y), 32


def raw_engine(stage: int, accumulation: int):
    import deepspeed
    import torch

    model, dataset, batch = build(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    config = {"train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": accumulation,
              "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True, "gradient_clipping": 1.0,
              "steps_per_print": 2**62}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    sampler = torch.utils.data.DistributedSampler(dataset, shuffle=False)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, sampler=sampler)

    def run(steps: int) -> tuple[float, float]:
        start, cpu_start = time.perf_counter(), time.thread_time()
        for step, (x, y) in enumerate(loader):
            if step == steps:
                break
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
        return time.perf_counter() - start, time.thread_time() - cpu_start

    return run


def hasten_engine(stage: int, accumulation: int):
    import torch

    from hasten import Accelerator
    from hasten.utils.deepspeed import DeepSpeedPlugin

    plugin = DeepSpeedPlugin(zero_stage=stage, gradient_clipping=1.0)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation, deepspeed_plugin=plugin)
    model, dataset, batch = build(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    def run(steps: int) -> tuple[float, float]:
        start, cpu_start = time.perf_counter(), time.thread_time()
        for step, (x, y) in enumerate(loader):
            if step == steps:
                break
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
        return time.perf_counter() - start, time.thread_time() - cpu_start

    return run


def compare(stage: int, accumulation: int, rounds: int, steps: int) -> float:
    import torch.distributed as dist

    raw, hasten = raw_engine(stage, accumulation), hasten_engine(stage, accumulation)
    raw(8), hasten(8)  # warm-up
    wall_ratios, cpu_ratios, raw_rates, hasten_rates = [], [], [], []
    for index in range(rounds):
        order = (raw, hasten) if index % 2 == 0 else (hasten, raw)
        timings = {}
        for loop in order:
            gc.collect()
            dist.barrier()
            timings[loop] = loop(steps)
        (raw_wall, raw_cpu), (hasten_wall, hasten_cpu) = timings[raw], timings[hasten]
        raw_rates.append(steps / raw_wall)
        hasten_rates.append(steps / hasten_wall)
        wall_ratios.append(raw_wall / hasten_wall)
        cpu_ratios.append(raw_cpu / hasten_cpu)
    wall, cpu = statistics.median(wall_ratios), statistics.median(cpu_ratios)
    if dist.get_rank() == 0:
        print(f"ZeRO-{stage} acc={accumulation}  raw {statistics.median(raw_rates):6.1f} steps/s  "
              f"hasten {statistics.median(hasten_rates):6.1f} steps/s  wall ratio {wall:.3f}  CPU ratio {cpu:.3f}  "
              f"{'ok' if max(wall, cpu) >= 0.99 else 'BELOW 0.99'}", flush=True)
        record("steps", f"ZeRO-{stage} mlp acc={accumulation} fp32", framework="hasten", engine=f"ZeRO-{stage}",
               model="mlp", accumulation=accumulation, precision="fp32", rounds=rounds, steps_per_round=steps,
               raw_steps_s=statistics.median(raw_rates), steps_s=statistics.median(hasten_rates), wall_ratio=wall,
               cpu_ratio=cpu, verdict_on="max(wall_ratio, cpu_ratio)", ok=max(wall, cpu) >= 0.99)
    return wall


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    from hasten import PartialState

    state = PartialState(cpu=True)  # the gloo group both loops share
    rounds, steps = (6, 24) if args.quick else (20, 40)
    if state.is_main_process:
        print("-- steps/s, 2 processes (gloo, CPU); ratio = median over alternating rounds of hasten/raw", flush=True)
    for stage in (2, 3):
        for accumulation in (1, 4):
            compare(stage, accumulation, rounds, steps)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    peaks = [None] * dist.get_world_size()
    dist.all_gather_object(peaks, peak)
    if state.is_main_process:
        print("peak RSS per rank (both loops): " + ", ".join(f"rank {r} {p:.0f} MiB" for r, p in enumerate(peaks)), flush=True)
        record("memory", "deepspeed_steps.py, per rank (raw + hasten engines, ZeRO-2 and 3)", peak_mib=max(peaks),
               per_rank_mib=peaks)
    state.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds (noisier)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    return launch_self(__file__, "--worker", *(["--quick"] if args.quick else []))


if __name__ == "__main__":
    raise SystemExit(main())
