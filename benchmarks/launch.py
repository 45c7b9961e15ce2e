"""Launch-to-exit time of a trivial 2-process job: `hasten launch` vs `torchrun`.

    python benchmarks/launch.py [--repeats 9]

Both start the same script (init_process_group + one all_reduce + clean
shutdown) on 2 processes with gloo, alternating runs so machine noise hits
both alike; prints the medians and the ratio hasten/torchrun (target <= 1.05).
Also times `hasten --help` and `hasten launch --help` (no torch import).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRIVIAL = """\
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == dist.get_world_size()
dist.barrier()
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "trivial.py"
        script.write_text(TRIVIAL)
        commands = {
            "torchrun": lambda: [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                                 f"--master-port={free_port()}", str(script)],
            "hasten launch": lambda: [sys.executable, "-m", "hasten", "launch", "--num_processes", "2", str(script)],
        }
        timed(commands["torchrun"]())  # warm the page cache
        times: dict[str, list[float]] = {name: [] for name in commands}
        for index in range(args.repeats):
            order = list(commands) if index % 2 == 0 else list(reversed(commands))
            for name in order:
                times[name].append(timed(commands[name]()))
    base = statistics.median(times["torchrun"])
    print(f"-- launch to exit, 2 processes (gloo), median of {args.repeats} alternating runs")
    for name, samples in times.items():
        ratio = statistics.median(samples) / base
        verdict = "" if name == "torchrun" else ("ok" if ratio <= 1.05 else "ABOVE 1.05")
        print(f"{name:<15} {statistics.median(samples):6.2f} s  (min {min(samples):.2f})  ratio {ratio:.3f}  {verdict}")
    print("-- help (must not import torch)")
    for argv in (["--help"], ["launch", "--help"]):
        samples = [timed([sys.executable, "-m", "hasten", *argv]) for _ in range(5)]
        print(f"hasten {' '.join(argv):<15} {statistics.median(samples) * 1e3:6.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
