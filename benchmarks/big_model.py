"""Loading a model bigger than its CPU budget: peak memory and time, and forward speed with disk offload.

    python benchmarks/big_model.py            # ~500M parameters (2 GB of fp32 weights), 1 GiB CPU budget
    python benchmarks/big_model.py --quick    # ~130M parameters, 256 MiB budget

The model (an embedding, N MLP blocks of width 2048, a head) is saved once as
sharded safetensors. Each way of loading runs in a fresh process, and reports
the growth of its peak resident memory over what it held just before loading
(the peak is reset through /proc/self/clear_refs, so importing torch and the
empty model do not count), the load time, and forward throughput:

- `load_state_dict`: build the model in memory and load the state dict (what
  most scripts do);
- hasten `load_checkpoint_and_dispatch` with `max_memory={"cpu": BUDGET}` and an
  offload folder: the blocks that do not fit stay on disk and are memory-mapped
  one block at a time during the forward;
- the same call in Accelerate, when it is installed in this environment.

Every way's outputs are compared with the fully loaded model's (max |diff| printed).
The "vs loaded" figure is the fully loaded model's forward time over the
offloaded one's, both measured in the same process, alternating, 5 rounds,
medians (the loaded model is built after the memory figures are taken).

Each child runs with ``MALLOC_MMAP_THRESHOLD_=131072``: glibc otherwise raises
its mmap threshold after the first large free and keeps freed activation
buffers in the heap, which shows up as ~150 MiB of "peak" that no loader
holds. The setting is the same for every way.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from _children import run_json_child
from _results import record

SIZES = {"full": dict(width=2048, blocks=15, vocab=8192, budget="1GiB"),
         "quick": dict(width=1024, blocks=15, vocab=4096, budget="256MiB")}
TOKENS = (4, 128)  # batch x sequence for the forward


def build(width: int, blocks: int, vocab: int):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = nn.Linear(width, 4 * width)
            self.down = nn.Linear(4 * width, width)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(x)))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.blocks = nn.Sequential(*(Block() for _ in range(blocks)))
            self.head = nn.Linear(width, vocab)

        def forward(self, tokens):
            return self.head(self.blocks(self.embed(tokens)))

    return Model()


def _peak_reset() -> None:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/self/status")


def measure(way: str, size: str, folder: str) -> dict:
    """One way of loading, in this (fresh) process: memory growth, load time, forward speed, outputs."""
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 2)))
    spec = SIZES[size]
    tokens = torch.randint(0, spec["vocab"], TOKENS, generator=torch.Generator().manual_seed(0))
    if way == "load_state_dict":
        _peak_reset()
        base = _rss_kib("VmRSS")
        start = time.perf_counter()
        model = _load_in_memory(spec, folder)
    else:
        if way == "hasten":
            from hasten import init_empty_weights, load_checkpoint_and_dispatch
        else:
            from accelerate import init_empty_weights, load_checkpoint_and_dispatch
        offload = Path(folder) / f"offload-{way}"
        shutil.rmtree(offload, ignore_errors=True)
        with init_empty_weights():
            model = build(spec["width"], spec["blocks"], spec["vocab"])
        _peak_reset()
        base = _rss_kib("VmRSS")
        start = time.perf_counter()
        model = load_checkpoint_and_dispatch(model, str(Path(folder) / "model"), device_map="auto",
                                             max_memory={"cpu": spec["budget"]}, offload_folder=str(offload),
                                             no_split_module_classes=["Block"])
    load_seconds = time.perf_counter() - start
    load_peak = _rss_kib("VmHWM") - base
    with torch.inference_mode():
        out = model(tokens)  # warm-up (first touch of the mapped files)
        peak = _rss_kib("VmHWM") - base
        loaded = model if way == "load_state_dict" else _load_in_memory(spec, folder)
        loaded(tokens)
        # The two forwards alternate in this one process, 5 rounds, medians: on a shared 2-core machine two
        # processes measured one after the other drifted apart by up to 7%.
        times: dict[str, list[float]] = {"offloaded": [], "loaded": []}
        for _ in range(5):
            for kind, m in (("offloaded", model), ("loaded", loaded)):
                start = time.perf_counter()
                result = m(tokens)
                times[kind].append(time.perf_counter() - start)
                if kind == "offloaded":
                    out = result
        seconds = {kind: sorted(t)[len(t) // 2] for kind, t in times.items()}
    torch.save(out, Path(folder) / f"out-{way}.pt")
    return {"way": way, "load_s": load_seconds, "load_peak_mib": load_peak / 1024, "peak_mib": peak / 1024,
            "tokens_per_s": TOKENS[0] * TOKENS[1] / seconds["offloaded"],
            "speed_vs_loaded": seconds["loaded"] / seconds["offloaded"],
            "modules_on_disk": sum(d == "disk" for d in getattr(model, "hf_device_map", {}).values())}


def _load_in_memory(spec: dict, folder: str):
    """The model built in memory with every weight loaded from the safetensors files (the reference)."""
    from safetensors.torch import load_file

    index = json.loads((Path(folder) / "model" / "model.safetensors.index.json").read_text())
    model = build(spec["width"], spec["blocks"], spec["vocab"])
    state = {}
    for shard in dict.fromkeys(index["weight_map"].values()):
        state.update(load_file(str(Path(folder) / "model" / shard)))
    model.load_state_dict(state)
    return model


def prepare(size: str, folder: str) -> dict:
    import torch

    from hasten.checkpointing.model_files import write_model_files

    torch.manual_seed(0)
    spec = SIZES[size]
    model = build(spec["width"], spec["blocks"], spec["vocab"])
    write_model_files(model.state_dict(), Path(folder) / "model", max_shard_size="500MB")
    parameters = sum(p.numel() for p in model.parameters())
    block = sum(p.numel() * 4 for p in model.blocks[0].parameters())
    return {"parameters": parameters, "block_mib": block / 2**20, "weights_mib": parameters * 4 / 2**20}


def run_child(*args: str) -> dict:
    return run_json_child(__file__, list(args), {"MALLOC_MMAP_THRESHOLD_": "131072"}, timeout=1800)  # see the docstring


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", nargs=3, metavar=("WAY", "SIZE", "FOLDER"), help=argparse.SUPPRESS)
    parser.add_argument("--prepare", nargs=2, metavar=("SIZE", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child)))
        return
    if args.prepare:
        print(json.dumps(prepare(*args.prepare)))
        return
    import torch

    size = "quick" if args.quick else "full"
    ways = ["load_state_dict", "hasten"] + (["accelerate"] if importlib.util.find_spec("accelerate") else [])
    with tempfile.TemporaryDirectory(prefix="hasten-bigmodel-") as folder:
        facts = run_child("--prepare", size, folder)
        budget = SIZES[size]["budget"]
        print(f"model: {facts['parameters'] / 1e6:.0f}M parameters, {facts['weights_mib']:.0f} MiB of fp32 weights in "
              f"sharded safetensors; largest block {facts['block_mib']:.0f} MiB; CPU budget {budget}", flush=True)
        results = [run_child("--child", way, size, folder) for way in ways]
        reference = torch.load(Path(folder) / "out-load_state_dict.pt", weights_only=True)
        print(f"{'way':18s} {'load s':>7s} {'peak growth while loading':>26s} {'peak growth incl. forward':>26s} "
              f"{'tokens/s':>9s} {'vs loaded':>9s} {'max |diff|':>10s} {'blocks on disk':>14s}")
        for r in results:
            diff = (torch.load(Path(folder) / f"out-{r['way']}.pt", weights_only=True) - reference).abs().max().item()
            print(f"{r['way']:18s} {r['load_s']:7.2f} {r['load_peak_mib']:22.0f} MiB {r['peak_mib']:22.0f} MiB "
                  f"{r['tokens_per_s']:9.0f} {r['speed_vs_loaded']:9.3f} {diff:10.2e} "
                  f"{r['modules_on_disk']:14d}",
                  flush=True)
            r["max_diff"] = diff
        from hasten.big_modeling.sizes import convert_file_size_to_int

        bound = convert_file_size_to_int(budget) / 2**20 + facts["block_mib"]
        print(f"bound for the offloaded loads: budget + largest block = {bound:.0f} MiB")
        framework = {"load_state_dict": "torch", "hasten": "hasten", "accelerate": "accelerate"}
        for r in results:
            record("big_model", r["way"], framework=framework[r["way"]], params_m=facts["parameters"] / 1e6,
                   weights_mib=facts["weights_mib"], block_mib=facts["block_mib"], budget=budget, bound_mib=bound,
                   load_s=r["load_s"], load_peak_mib=r["load_peak_mib"], peak_mib=r["peak_mib"],
                   tokens_per_s=r["tokens_per_s"], speed_vs_loaded=r["speed_vs_loaded"],
                   max_diff=r["max_diff"], modules_on_disk=r["modules_on_disk"],
                   within_bound=(r["peak_mib"] <= bound) if r["way"] != "load_state_dict" else None)


if __name__ == "__main__":
    main()
