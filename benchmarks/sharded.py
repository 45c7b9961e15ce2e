"""Sharded engines on 2 processes: peak memory per rank (DDP, FSDP2, ZeRO-3) and hasten's FSDP2 speed vs raw fully_shard.

    python benchmarks/sharded.py            # ~100M-parameter transformer for memory, then the speed rounds
    python benchmarks/sharded.py --quick    # a ~25M model, fewer rounds

Memory: one `hasten launch` per mode (peak RSS is a high-water mark, so modes
cannot share processes). Each rank builds the model, prepares it with AdamW,
trains 3 steps and reports its peak RSS and the bytes of parameters,
gradients and optimizer state it holds. Printed: a table with the ratio to DDP.

Speed: in the same 2 processes, hasten's FSDP2 loop (Accelerator + prepared
loader) and a hand-written FSDP2 loop (fully_shard per layer + root,
DistributedSampler), their steps interleaved (each timed alone); the ratio
is the median over rounds of hasten steps/s / raw steps/s (target >= 0.99),
by wall clock, with the main thread's CPU-time ratio beside it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _launch import launch_self
from _results import record


def build(size: str, seed: int = 0):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    width, layers, vocab = {"100m": (768, 12, 16384), "25m": (512, 6, 8192), "speed": (256, 4, 2048)}[size]

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.layers = nn.ModuleList(
                nn.TransformerEncoderLayer(width, width // 64, 4 * width, dropout=0.0, batch_first=True) for _ in range(layers))
            self.head = nn.Linear(width, vocab)

        def forward(self, tokens):
            x = self.embed(tokens)
            for layer in self.layers:
                x = layer(x)
            return self.head(x)

    return LM(), vocab


def data(vocab: int, n: int, seq: int = 64):
    import torch

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (n, seq + 1), generator=g)
    return torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:])


def held_bytes(model, optimizer) -> int:
    """Bytes of parameters, gradients and optimizer state this process holds (its shards under FSDP/ZeRO)."""
    import torch

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    total = 0
    for p in model.parameters():
        total += local(p).numel() * p.element_size()
        if p.grad is not None:
            total += local(p.grad).numel() * p.grad.element_size()
        ds = getattr(p, "ds_tensor", None)  # DeepSpeed ZeRO-3 keeps the shard aside
        if ds is not None:
            total += ds.numel() * ds.element_size() - local(p).numel() * p.element_size()
    inner = getattr(optimizer, "optimizer", optimizer)
    for state in getattr(inner, "state", {}).values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                total += local(v).numel() * v.element_size()
    return total


def reset_peak_rss():
    """Give freed memory back to the OS and reset the kernel's peak-RSS mark; returns a reader of the new peak (bytes)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None  # not Linux/glibc: only the lifetime peak is reported

    def read() -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return 0

    return read


def memory_worker(mode: str, size: str, out: Path) -> None:
    import torch
    import torch.nn.functional as F

    from hasten import Accelerator

    accelerator = Accelerator(cpu=True)
    model, vocab = build(size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = torch.utils.data.DataLoader(data(vocab, 16), batch_size=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    training_peak = reset_peak_rss()  # from here on: the peak of training alone (set-up copies excluded)
    for step, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        accelerator.backward(loss)
        optimizer.step()
        if step == 2:
            break
        optimizer.zero_grad()
    held = held_bytes(model, optimizer)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result = {"peak": peak, "held": held, "training_peak": training_peak() if training_peak else None}
    (out / f"{mode}.rank{accelerator.process_index}.json").write_text(json.dumps(result))
    accelerator.end_training()


def speed_worker(rounds: int, steps: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from hasten import Accelerator, FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="TRANSFORMER_BASED_WRAP",
                                            transformer_cls_names_to_wrap=["TransformerEncoderLayer"], cpu_ram_efficient_loading=False)
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = None

    model_h, vocab = build("speed")
    dataset = data(vocab, 4096)
    opt_h = torch.optim.AdamW(model_h.parameters(), lr=1e-4)
    loader_h = torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=True)
    model_h, opt_h, loader_h = accelerator.prepare(model_h, opt_h, loader_h)

    model_r, _ = build("speed")
    mesh = init_device_mesh("cpu", (world,))
    for layer in model_r.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model_r, mesh=mesh)
    opt_r = torch.optim.AdamW(model_r.parameters(), lr=1e-4)
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, world, rank, shuffle=True, seed=0)
    loader_r = torch.utils.data.DataLoader(dataset, batch_size=8, sampler=sampler)

    def step(model, optimizer, iterator, backward):
        x, y = next(iterator)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        backward(loss)
        optimizer.step()
        optimizer.zero_grad()

    loops = {"h": (model_h, opt_h, loader_h, accelerator.backward), "r": (model_r, opt_r, loader_r, lambda l: l.backward())}
    ratios, cpu_ratios, hasten_rates, raw_rates = [], [], [], []
    for r in range(rounds + 1):
        # The two loops' steps interleave, each timed alone, the order swapping every step: drift hits both alike.
        iterators = {name: iter(loader) for name, (_, _, loader, _) in loops.items()}
        wall, cpu = {"h": 0.0, "r": 0.0}, {"h": 0.0, "r": 0.0}
        dist.barrier()
        for index in range(steps):
            for name in (("h", "r") if (index + r) % 2 == 0 else ("r", "h")):
                model, opt, _, backward = loops[name]
                wall_start, cpu_start = time.perf_counter(), time.thread_time()
                step(model, opt, iterators[name], backward)
                cpu[name] += time.thread_time() - cpu_start
                wall[name] += time.perf_counter() - wall_start
        if r == 0:
            continue  # warm-up
        hasten_rates.append(steps / wall["h"])
        raw_rates.append(steps / wall["r"])
        ratios.append(wall["r"] / wall["h"])
        cpu_ratios.append(cpu["r"] / cpu["h"])
    if rank == 0:
        print(f"FSDP2 steps/s  hasten {statistics.median(hasten_rates):.2f}   raw fully_shard {statistics.median(raw_rates):.2f}   "
              f"ratio (median of {rounds} interleaved rounds) {statistics.median(ratios):.3f}  "
              f"[min {min(ratios):.3f}, max {max(ratios):.3f}]  CPU ratio {statistics.median(cpu_ratios):.3f}", flush=True)
        record("steps", "FSDP2 transformer acc=1 fp32", framework="hasten", engine="FSDP2", model="transformer",
               accumulation=1, precision="fp32", rounds=rounds, steps_per_round=steps,
               raw_steps_s=statistics.median(raw_rates), steps_s=statistics.median(hasten_rates),
               wall_ratio=statistics.median(ratios), wall_min=min(ratios), wall_max=max(ratios),
               cpu_ratio=statistics.median(cpu_ratios), verdict_on="wall_ratio", ok=statistics.median(ratios) >= 0.99)
    accelerator.end_training()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip_memory", action="store_true")
    parser.add_argument("--worker", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        kind, *rest = args.worker
        if kind == "memory":
            memory_worker(rest[0], rest[1], Path(rest[2]))
        else:
            speed_worker(int(rest[0]), int(rest[1]))
        return 0
    size = "25m" if args.quick else "100m"
    if not args.skip_memory:
        modes = {"DDP": [], "FSDP2": ["--use_fsdp", "--fsdp_transformer_layer_cls_to_wrap", "TransformerEncoderLayer"]}
        if importlib.util.find_spec("deepspeed") is not None:
            modes["ZeRO-3"] = ["--use_deepspeed", "--zero_stage", "3"]
        else:
            print("(DeepSpeed is not installed: no ZeRO-3 row; pip install 'hasten[deepspeed]')")
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            for mode, flags in modes.items():
                # Blocks >= 128 KiB mmapped, so freed memory leaves the process at once: RSS then follows live
                # memory instead of what glibc keeps cached after FSDP's per-layer gathers (which doubled the peak).
                launch_self(__file__, "--worker", "memory", mode, size, str(out), launch_args=("-q", *flags), check=True,
                            env={"MALLOC_MMAP_THRESHOLD_": "131072"})
            rows = {mode: [json.loads((out / f"{mode}.rank{r}.json").read_text()) for r in (0, 1)] for mode in modes}
        model, _ = build(size)
        params = sum(p.numel() for p in model.parameters())
        print(f"\nPeak memory per rank, {params / 1e6:.0f}M-parameter transformer, AdamW fp32, 2 ranks")
        print(f"{'mode':8} {'peak RSS, training (GiB)':>25} {'ratio':>6} {'peak RSS, whole run (GiB)':>26} {'ratio':>6} "
              f"{'params+grads+optimizer held (GiB)':>34} {'ratio':>6}")
        base = {key: max(r[key] or 0 for r in rows["DDP"]) for key in ("training_peak", "peak", "held")}
        for mode, ranks in rows.items():
            value = {key: max(r[key] or 0 for r in ranks) for key in base}
            ratio = {key: value[key] / base[key] if base[key] else float("nan") for key in base}
            print(f"{mode:8} {value['training_peak'] / 2**30:25.2f} {ratio['training_peak']:6.2f} {value['peak'] / 2**30:26.2f} "
                  f"{ratio['peak']:6.2f} {value['held'] / 2**30:34.2f} {ratio['held']:6.2f}")
            record("memory", f"{mode}, {params / 1e6:.0f}M transformer + AdamW, 2 ranks", mode=mode, framework="hasten",
                   params_m=params / 1e6, training_peak_gib=value["training_peak"] / 2**30,
                   training_peak_ratio=ratio["training_peak"], peak_gib=value["peak"] / 2**30, peak_ratio=ratio["peak"],
                   held_gib=value["held"] / 2**30, held_ratio=ratio["held"])
        print("(peak RSS, training: the kernel's high-water mark reset after prepare; whole run: including building the "
              "full model on every rank)")
    rounds, steps = (6, 5) if args.quick else (12, 8)
    print()
    launch_self(__file__, "--worker", "speed", str(rounds), str(steps), launch_args=("-q",), check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
