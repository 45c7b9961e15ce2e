"""Compile time and training speed: eager vs whole-model vs regional `torch.compile` (inductor), through hasten.

    python benchmarks/compile.py            # 3 rounds, 6 blocks of d=128
    python benchmarks/compile.py --quick    # 1 round, 4 blocks
    python benchmarks/compile.py --blocks 12 --rounds 1

The model is a stack of identical `nn.TransformerEncoderLayer` blocks in an
`nn.ModuleList` (an embedding before, a head after, no dropout), trained with
AdamW through `hasten.Accelerator(cpu=True)`:

- eager: no `dynamo_backend`;
- whole: `TorchDynamoPlugin(backend="inductor")`, the whole model compiled;
- regional: `TorchDynamoPlugin(backend="inductor", use_regional_compilation=True)`,
  each block compiled (the first block's graph serves the others), embedding
  and head apart.

Every (variant, round) runs in a fresh process with a fresh, empty inductor
cache directory, so each compile is cold; the rounds alternate the order of
the variants so machine noise hits all alike. *compile* = the first training
step's time minus a steady step's (what the compile costs); *steps/s* = the
median over rounds of the steady speed (after 3 warm-up steps). The final
losses are compared with eager's (compiled kernels may sum in another order).
One thread per process (the shared CPU machine's steadiest setting).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from _children import run_json_child
from _results import record

VARIANTS = ("eager", "whole", "regional")
SIZES = {"full": dict(width=128, blocks=6, seq=32, batch=8, steps=60, rounds=3),
         "quick": dict(width=128, blocks=4, seq=32, batch=8, steps=30, rounds=1)}


def child(variant: str, width: int, blocks: int, seq: int, batch: int, steps: int) -> dict:
    """One variant in this (fresh) process: first-step time, steady steps/s, last loss."""
    import torch
    from torch import nn

    from hasten import Accelerator
    from hasten.utils import TorchDynamoPlugin

    torch.set_num_threads(1)
    torch.manual_seed(0)

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(16, width)
            self.blocks = nn.ModuleList([nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True)
                                         for _ in range(blocks)])
            self.head = nn.Linear(width, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.embed(x)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    plugin = None if variant == "eager" else TorchDynamoPlugin(backend="inductor",
                                                                use_regional_compilation=variant == "regional")
    accelerator = Accelerator(cpu=True, dynamo_plugin=plugin)
    net = Stack()
    model, optimizer = accelerator.prepare(net, torch.optim.AdamW(net.parameters(), lr=1e-3))
    data = torch.randn(4, batch, seq, 16)

    def step(i: int) -> float:
        loss = model(data[i % len(data)]).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()

    start = time.perf_counter()
    step(0)
    first = time.perf_counter() - start
    for i in range(1, 4):
        step(i)
    start = time.perf_counter()
    for i in range(steps):
        loss = step(i)
    steady = (time.perf_counter() - start) / steps
    return {"variant": variant, "first_s": first, "step_s": steady, "compile_s": max(first - steady, 0.0),
            "steps_s": 1.0 / steady, "loss": loss}


def run_child(variant: str, size: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="hasten-inductor-") as cache:
        env = {"TORCHINDUCTOR_CACHE_DIR": cache, "OMP_NUM_THREADS": "1"}
        config = {k: size[k] for k in ("width", "blocks", "seq", "batch", "steps")}
        return run_json_child(__file__, ["--child", variant, "--config", json.dumps(config)], env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 round, a smaller model")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--blocks", type=int, default=None, help="number of blocks (default 6, 4 with --quick)")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, **json.loads(args.config))))
        return 0
    size = dict(SIZES["quick" if args.quick else "full"])
    rounds = args.rounds or size["rounds"]
    size["blocks"] = args.blocks or size["blocks"]
    print(f"compile: {size['blocks']} TransformerEncoderLayer blocks (d={size['width']}, sequence {size['seq']}, "
          f"batch {size['batch']}), AdamW, inductor, 1 thread; {rounds} round(s), cold cache each", flush=True)
    results: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        order = VARIANTS[r % 3:] + VARIANTS[:r % 3]
        for variant in order:
            result = run_child(variant, size)
            results[variant].append(result)
            print(f"  round {r + 1} {variant:8s} first step {result['first_s']:6.2f} s, compile "
                  f"{result['compile_s']:6.2f} s, {result['steps_s']:6.1f} steps/s, loss {result['loss']:.6f}",
                  flush=True)
    med = {v: {k: statistics.median(x[k] for x in results[v]) for k in ("compile_s", "steps_s", "first_s")}
           for v in VARIANTS}
    eager_loss = results["eager"][-1]["loss"]
    print(f"\n{'variant':10s} {'compile s':>10s} {'steps/s':>9s} {'vs eager':>9s} {'|loss - eager|':>15s}")
    for v in VARIANTS:
        speed = med[v]["steps_s"] / med["eager"]["steps_s"]
        diff = abs(results[v][-1]["loss"] - eager_loss)
        print(f"{v:10s} {med[v]['compile_s']:10.2f} {med[v]['steps_s']:9.1f} {speed:9.3f} {diff:15.1e}")
        record("compile", v, compile_s=med[v]["compile_s"], steps_s=med[v]["steps_s"], speed_vs_eager=speed,
               loss_diff=diff, rounds=rounds, blocks=size["blocks"], width=size["width"])
    compile_ratio = med["regional"]["compile_s"] / med["whole"]["compile_s"]
    speed_ratio = med["regional"]["steps_s"] / med["whole"]["steps_s"]
    print(f"\nregional / whole: compile time {compile_ratio:.3f}, steps/s {speed_ratio:.3f}")
    record("compile", "regional / whole", compile_ratio=compile_ratio, speed_ratio=speed_ratio, rounds=rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
