"""Parts of overhead.py: the small collective's fixed cost, import time, the alternating order of rounds, a loop's driver."""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
from pathlib import Path
import sys
import time
from typing import Any

from _results import record


def rotations(names: list[str], index: int) -> list[str]:
    """Round `index`'s order: rotated by one each round (for two loops: AB, BA, AB, ...)."""
    shift = index % len(names)
    return names[shift:] + names[:shift]


def run_loop(steps_of_a_loop) -> Any:
    """Drive a loop's step generator to the end; returns what it returns (the trained model)."""
    while True:
        try:
            next(steps_of_a_loop)
        except StopIteration as finished:
            return finished.value


def compare_small_collective(rounds: int) -> float:
    """hasten's reduce of one float against a raw all-reduce (and the path several machines take), rounds alternating."""
    import torch
    import torch.distributed as dist

    # The fixed cost per explicit collective (mismatch check + watchdog mark), on the smallest input. On one
    # machine hasten's small collective is a shared-memory exchange; "network" forces the path several machines
    # take (the check's all-reduce, then the collective), measured in the same rounds.
    from hasten.process import board as host_board
    from hasten.utils import reduce

    tiny = torch.ones(1)
    on_board = host_board.board
    small = {"raw": lambda: dist.all_reduce(tiny.clone()), "hasten": lambda: reduce(tiny), "network": lambda: reduce(tiny)}
    small_times = {name: [] for name in small}
    for round_index in range(rounds):
        for which in rotations(list(small), round_index):
            host_board.board = (lambda: None) if which == "network" else on_board
            dist.barrier()
            start = time.perf_counter()
            for _ in range(50):
                small[which]()
            small_times[which].append((time.perf_counter() - start) / 50)
    host_board.board = on_board
    if dist.get_rank() == 0:
        raw_us, hasten_us, network_us = (statistics.median(small_times[name]) * 1e6 for name in small)
        small_ratio = hasten_us / raw_us
        print(f"reduce of 1 float  raw {raw_us:7.1f} us   hasten {hasten_us:7.1f} us   hasten/raw {small_ratio:.2f}  "
              f"{'ok' if small_ratio <= 1.2 else 'ABOVE 1.2'} (one machine: values shared with the shape check "
              f"in shared memory)", flush=True)
        print(f"reduce of 1 float  raw {raw_us:7.1f} us   hasten without the board {network_us:7.1f} us   hasten/raw "
              f"{network_us / raw_us:.2f}  (several machines: the check's all-reduce, then the collective)", flush=True)
        record("gather", "reduce of 1 float", framework="hasten", rounds=rounds, raw_us=raw_us, us=hasten_us,
               added_us=hasten_us - raw_us, ratio=small_ratio, ok=small_ratio <= 1.2, network_us=network_us)
    return statistics.median(small_times["hasten"]) / statistics.median(small_times["raw"])


# ---------------------------------------------------------------------------- import time (fresh interpreters)
def import_seconds(statement: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], check=True)
    return time.perf_counter() - start


def compare_imports(repeats: int) -> None:
    statements = {
        "import torch": "import torch",
        "import hasten": "import hasten",
        "from hasten import Accelerator": "from hasten import Accelerator",
    }
    if importlib.util.find_spec("accelerate") is not None:  # peers, when installed here
        statements["import accelerate"] = "import accelerate"
        statements["from accelerate import Accelerator"] = "from accelerate import Accelerator"
    if importlib.util.find_spec("lightning") is not None:
        statements["from lightning.fabric import Fabric"] = "from lightning.fabric import Fabric"
    # hasten's bytecode cached as a user's install has it (pip compiles it; an editable install writes it at the
    # first import unless PYTHONDONTWRITEBYTECODE is set, as on this machine), like torch's in site-packages
    import hasten

    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(hasten.__file__).parent)], check=True)
    import_seconds("import torch")  # warm the page cache
    times = {name: [] for name in statements}
    for _ in range(repeats):
        for name, statement in statements.items():
            times[name].append(import_seconds(statement))
    base = statistics.median(times["import torch"])
    print(f"-- import time, fresh interpreter, median of {repeats}")
    for name, samples in times.items():
        ratio = statistics.median(samples) / base
        framework = next(f for f in ("torch", "hasten", "accelerate", "fabric") if f in name.replace("lightning", "fabric"))
        if framework in ("hasten", "torch"):
            verdict = "" if name == "import torch" else ("ok" if ratio <= 1.05 else "ABOVE 1.05")
        else:
            verdict = "(peer)"
        print(f"{name:<32} {statistics.median(samples) * 1e3:7.0f} ms   ratio to import torch {ratio:.3f}  {verdict}")
        record("import", name, framework=framework, repeats=repeats, ms=statistics.median(samples) * 1e3,
               ratio=ratio, ok=(ratio <= 1.05) if framework == "hasten" else None)
