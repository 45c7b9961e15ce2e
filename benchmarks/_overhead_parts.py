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
    _import_parts(statements, repeats, base)


# What `import torch` leaves due: its import ends with the collector's oldest generation over its threshold, so the next
# few hundred allocations after it (an import, or the user's first line) run a full collection of torch's ~170k
# objects. Each statement's own part is timed in one interpreter after `import torch` with the collector off.
_OWN = ("import gc, time, torch\ngc.disable()\nstart = time.perf_counter()\n{statement}\n"
        "print(time.perf_counter() - start)")
_DUE = ("import gc, time, torch\n{off}start = time.perf_counter()\nkept = [[] for _ in range(2000)]\n"
        "print(time.perf_counter() - start)")


def _seconds_printed(code: str) -> float:
    result = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return float(result.stdout.strip().splitlines()[-1])


def _import_parts(statements: dict[str, str], repeats: int, base: float) -> None:
    due = statistics.median(_seconds_printed(_DUE.format(off="")) for _ in range(repeats))
    without = statistics.median(_seconds_printed(_DUE.format(off="gc.disable()\n")) for _ in range(repeats))
    print(f"-- the collection `import torch` leaves due: 2000 new lists after it take {due * 1e3:.0f} ms, "
          f"{without * 1e3:.1f} ms with the collector off")
    record("import", "the collection due after import torch (paid by the next allocations)", framework="torch",
           repeats=repeats, ms=(due - without) * 1e3, ratio=(base + due - without) / base, ok=None)
    for name in ("from hasten import Accelerator", "from accelerate import Accelerator"):
        if name not in statements:
            continue
        own = statistics.median(_seconds_printed(_OWN.format(statement=statements[name])) for _ in range(repeats))
        framework = name.split()[1]
        print(f"{name + ', own part':<40} {own * 1e3:7.1f} ms after `import torch` (collector off)   "
              f"(import torch + it) / import torch {(base + own) / base:.3f}")
        record("import", f"{name}: its own part after import torch, collector off", framework=framework,
               repeats=repeats, ms=own * 1e3, ratio=(base + own) / base, ok=None)
