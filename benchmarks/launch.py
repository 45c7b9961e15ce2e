"""Launch-to-exit time of a trivial 2-process job: `hasten launch` vs `torchrun`.

    python benchmarks/launch.py [--repeats 15] [--quick]

Both start the same script (init_process_group + one all_reduce + clean
shutdown) on 2 processes with gloo, alternating runs so machine noise hits
both alike; prints the medians and the ratio hasten/torchrun (target <= 1.05).

Then the same with a script that builds an Accelerator (Accelerator(cpu=True),
one reduce, wait_for_everyone, end_training): `hasten launch` of it with
`hasten.Accelerator` against `torchrun` of the raw script above (the target
<= 1.05 again: what a user pays for launcher + Accelerator together), and,
when Accelerate is installed in this environment, `accelerate launch` of the
same script with `accelerate.Accelerator` (`--multi_gpu --num_processes 2`:
the launch that starts 2 processes; on CPUs the script's `cpu=True` makes
them one group). All variants alternate in the same rounds.
Also times `hasten --help` and `hasten launch --help` (no torch import).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import record

TRIVIAL = """\
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == dist.get_world_size()
dist.barrier()
dist.destroy_process_group()
"""


WITH_ACCELERATOR = """\
import torch
from {package} import Accelerator
accelerator = Accelerator(cpu=True)
t = accelerator.reduce(torch.ones(1), "sum")
assert t.item() == accelerator.num_processes == 2, (t, accelerator.num_processes)
accelerator.wait_for_everyone()
accelerator.end_training()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def timed(command: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120,
                   env={**os.environ, **env} if env else None)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=None, help="runs of each variant (default 15, 3 with --quick)")
    parser.add_argument("--quick", action="store_true", help="fewer repeats (noisier)")
    args = parser.parse_args()
    if args.repeats is None:
        args.repeats = 3 if args.quick else 15
    peer = importlib.util.find_spec("accelerate") is not None
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "trivial.py"
        script.write_text(TRIVIAL)
        with_hasten, with_accelerate = Path(tmp) / "with_hasten.py", Path(tmp) / "with_accelerate.py"
        with_hasten.write_text(WITH_ACCELERATOR.format(package="hasten"))
        with_accelerate.write_text(WITH_ACCELERATOR.format(package="accelerate"))
        # `accelerate launch` must not read a config file of this machine's user: flags only
        peer_env = {"HF_HOME": str(Path(tmp) / "hf_home")}
        commands = {
            "torchrun": lambda: [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                                 f"--master-port={free_port()}", str(script)],
            "hasten launch": lambda: [sys.executable, "-m", "hasten", "launch", "--num_processes", "2", str(script)],
            "hasten launch + hasten.Accelerator": lambda: [sys.executable, "-m", "hasten", "launch", "--num_processes",
                                                           "2", str(with_hasten)],
        }
        if peer:
            commands["accelerate launch + accelerate.Accelerator"] = lambda: [
                sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", str(free_port()), str(with_accelerate)]
        envs = {"accelerate launch + accelerate.Accelerator": peer_env}
        timed(commands["torchrun"]())  # warm the page cache
        for name, command in commands.items():  # and every variant's imports once
            timed(command(), envs.get(name))
        times: dict[str, list[float]] = {name: [] for name in commands}
        for index in range(args.repeats):
            names = list(commands)
            shift = index % len(names)  # rotate who goes first (two variants: AB, BA, ...)
            for name in names[shift:] + names[:shift]:
                times[name].append(timed(commands[name](), envs.get(name)))
    base = statistics.median(times["torchrun"])
    print(f"-- launch to exit, 2 processes (gloo), median of {args.repeats} alternating runs")
    for name, samples in times.items():
        if name == "hasten launch + hasten.Accelerator":
            print("-- the same, for a script that builds an Accelerator; ratio to torchrun of the raw script above")
        ratio = statistics.median(samples) / base
        framework = name.split()[0]
        if framework == "hasten":
            verdict = "ok" if ratio <= 1.05 else "ABOVE 1.05"
        else:
            verdict = "" if name == "torchrun" else "(peer)"
        print(f"{name:<15} {statistics.median(samples):6.2f} s  (min {min(samples):.2f})  ratio {ratio:.3f}  {verdict}")
        record("launch", name, framework=framework, repeats=args.repeats, seconds=statistics.median(samples),
               min_seconds=min(samples), ratio=ratio, ok=(ratio <= 1.05) if framework == "hasten" else None)
    print("-- help (must not import torch)")
    for argv in (["--help"], ["launch", "--help"]):
        samples = [timed([sys.executable, "-m", "hasten", *argv]) for _ in range(5)]
        print(f"hasten {' '.join(argv):<15} {statistics.median(samples) * 1e3:6.0f} ms")
        record("launch", f"hasten {' '.join(argv)}", framework="hasten", help=True, seconds=statistics.median(samples))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
