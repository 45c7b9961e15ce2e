"""fp8 training through torchao (emulated on a CPU): hasten against raw PyTorch + torchao and against Accelerate.

    python benchmarks/fp8.py            # 3 rounds
    python benchmarks/fp8.py --quick    # 1 round, fewer steps

The model is an MLP stack (an input Linear, residual blocks of Linear 256→1024→256, a head), trained with
AdamW on one process, one thread:

- raw: plain PyTorch: torchao's `convert_to_float8_training` with Accelerate's default filter (first and
  last Linear kept), forward under bf16 autocast, the loop by hand;
- hasten: `Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs(config=...)])`;
- accelerate: the same script under Accelerate 1.16 (when installed);
- raw bf16: the raw loop without fp8, for context (emulated fp8 is not faster than bf16 on a CPU).

All fp8 variants use ``Float8LinearConfig(emulate=True)``: torchao's emulation, the fp8 path a CPU runs
fastest (torch's CPU `_scaled_mm` is ~6× slower here). Every (variant, round) runs in a fresh process;
rounds alternate the order. *steps/s* is the median over rounds of the steady speed after 3 warm-up
steps; the final losses of hasten and Accelerate are compared bit for bit.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time

from _children import run_json_child
from _results import record

VARIANTS = ("raw", "hasten", "accelerate", "raw bf16")
SIZES = {"full": dict(width=256, blocks=4, batch=64, steps=40, rounds=3),
         "quick": dict(width=256, blocks=4, batch=64, steps=15, rounds=1)}


def child(variant: str, width: int, blocks: int, batch: int, steps: int) -> dict:
    """One variant in this (fresh) process: steady steps/s and the last loss."""
    import torch
    from torch import nn

    torch.set_num_threads(1)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(torch.nn.functional.gelu(self.up(x)))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(64, width)
            self.blocks = nn.ModuleList([Block() for _ in range(blocks)])
            self.head = nn.Linear(width, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.embed(x)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    torch.manual_seed(0)
    net = Net()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    data = torch.randn(4, batch, 64), torch.randn(4, batch, 16)
    backward = torch.Tensor.backward
    if variant in ("hasten", "accelerate"):
        from torchao.float8 import Float8LinearConfig

        lib = __import__(variant)
        utils = __import__(f"{variant}.utils", fromlist=["AORecipeKwargs"])
        recipe = utils.AORecipeKwargs(config=Float8LinearConfig(emulate=True))
        accelerator = lib.Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[recipe])
        model, optimizer = accelerator.prepare(net, optimizer)
        backward = accelerator.backward
    else:
        if variant == "raw":
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training

            skip = {"embed", "head"}  # Accelerate's default: the first and last Linear stay in high precision
            convert_to_float8_training(net, config=Float8LinearConfig(emulate=True),
                                       module_filter_fn=lambda module, fqn: fqn not in skip)
        plain = net

        def model(x: torch.Tensor) -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return plain(x).float()

    def step(i: int) -> float:
        loss = torch.nn.functional.mse_loss(model(data[0][i % 4]), data[1][i % 4])
        backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()

    for i in range(3):
        step(i)
    start = time.perf_counter()
    for i in range(steps):
        loss = step(i)
    steady = (time.perf_counter() - start) / steps
    return {"variant": variant, "steps_s": 1.0 / steady, "loss": loss}


def run_child(variant: str, size: dict) -> dict:
    config = {k: size[k] for k in ("width", "blocks", "batch", "steps")}
    return run_json_child(__file__, ["--child", variant, "--config", json.dumps(config)], {"OMP_NUM_THREADS": "1"})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 round, fewer steps")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, **json.loads(args.config))))
        return 0
    if importlib.util.find_spec("torchao") is None:
        raise SystemExit("fp8.py needs torchao (pip install torchao)")
    size = dict(SIZES["quick" if args.quick else "full"])
    rounds = args.rounds or size["rounds"]
    variants = [v for v in VARIANTS if v != "accelerate" or importlib.util.find_spec("accelerate")]
    print(f"fp8 (emulated): {size['blocks']} blocks of d={size['width']}, batch {size['batch']}, AdamW, 1 thread; "
          f"{rounds} round(s) of {size['steps']} steady steps", flush=True)
    results: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(rounds):
        for variant in variants[r % len(variants):] + variants[:r % len(variants)]:
            result = run_child(variant, size)
            results[variant].append(result)
            print(f"  round {r + 1} {variant:10s} {result['steps_s']:7.2f} steps/s, loss {result['loss']:.6f}", flush=True)
    speed = {v: statistics.median(x["steps_s"] for x in results[v]) for v in variants}
    same = "accelerate" in results and all(a["loss"] == b["loss"] for a, b in zip(results["hasten"], results["accelerate"]))
    print(f"\n{'variant':10s} {'steps/s':>8s} {'vs raw':>7s} {'vs accelerate':>14s}")
    for v in variants:
        vs_peer = speed[v] / speed["accelerate"] if "accelerate" in speed else None
        print(f"{v:10s} {speed[v]:8.2f} {speed[v] / speed['raw']:7.3f} "
              f"{'-' if vs_peer is None else f'{vs_peer:.3f}':>14s}")
        record("fp8", v, steps_s=speed[v], vs_raw=speed[v] / speed["raw"], vs_accelerate=vs_peer, rounds=rounds,
               blocks=size["blocks"], width=size["width"], emulated=True)
    print(f"\nhasten's losses equal Accelerate's bit for bit: {same}")
    record("fp8", "losses equal Accelerate's", equal=same, rounds=rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
