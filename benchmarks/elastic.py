"""Elastic runs: how long a run stands still when it loses a machine or one returns, and what periodic checkpoints cost.

    python benchmarks/elastic.py            # 3 rounds per engine (DDP, FSDP2, ZeRO-2); 6 rounds of the save cost
    python benchmarks/elastic.py --quick    # 1 round, DDP only; 3 rounds of the save cost

1. Recovery. Two "machines" on this host (two `hasten launch --num_machines 1:2` commands, one process each,
   sharing a c10d endpoint on 127.0.0.1) train `tests/scripts/elastic_train.py`. After 6 steps machine 1's launcher
   and worker are SIGKILLed: *shrink* is the time from the kill to the first optimizer step on machine 0 alone.
   After 2 steps alone machine 1's command starts again: *grow* is the time from that start to the first step on
   two machines. The runs finish and their final parameters are compared with an uninterrupted 2-process run.
   The peers have no such mode: a run of Accelerate or Fabric that loses a machine ends, and a person starts it
   again by hand on the machines left (Accelerate refuses a different number of processes at resume).
2. Periodic checkpoints. One 2-process DDP run (`_periodic_train.py`, an MLP of 6M parameters, one thread per
   process) alternates rounds of 60 steps with `save_every_n_steps=20` (asynchronous) and without: the ratio of
   the rounds' times, median over rounds, is what the saves cost the training loop.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _launch import kill_tree
from _results import record

HERE = Path(__file__).resolve().parent
SCRIPT = HERE.parent / "tests" / "scripts" / "elastic_train.py"
MARK = "HASTEN_BENCH_ELASTIC_MACHINE"
EPOCHS = 3


def _env(mark: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "LOCAL_"))}
    return {**env, "PYTHONUNBUFFERED": "1", "HASTEN_CONFIG_FILE": "/nonexistent/hasten.yaml", MARK: mark}


def _kill_machine(mark: str) -> None:
    needle = f"{MARK}={mark}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                pass


def _steps(out: Path, world: int, after: float) -> list[float]:
    times = []
    for path in out.glob("steps.rank*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if row["world"] == world and row["time"] > after:
                times.append(row["time"])
    return times


def _until(condition, limit: float) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def recovery_round(engine: str, work: Path, port: int) -> dict:
    """One kill-and-return scenario; the seconds each change kept the run from training."""
    out = work / f"{engine}-{port}"
    out.mkdir(parents=True)
    command = [sys.executable, "-m", "hasten", "launch", "--num_machines", "1:2", "--num_processes", "2",
               "--main_process_ip", "127.0.0.1", "--main_process_port", str(port), "--max_restarts", "3",
               "--machine_rank", "{rank}", str(SCRIPT), str(out), engine, "0.2", str(EPOCHS)]

    def start(rank: int) -> subprocess.Popen:
        argv = [part.replace("{rank}", str(rank)) for part in command]
        return subprocess.Popen(argv, stdout=(out / f"m{rank}.log").open("a"), stderr=subprocess.STDOUT,
                                env=_env(f"{port}-{rank}"), start_new_session=True)

    machines = [start(0)]
    time.sleep(1.0)
    machines.append(start(1))
    try:
        if not _until(lambda: len(_steps(out, 2, 0)) >= 12, 300):
            return {"error": "no steps on two machines"}
        (out / "pace").write_text("0.6")
        killed = time.time()
        _kill_machine(f"{port}-1")
        if not _until(lambda: len(_steps(out, 1, killed)) >= 2, 240):
            return {"error": "the survivor did not step"}
        shrink = min(_steps(out, 1, killed)) - killed
        (out / "pace").write_text("1.5")
        restarted = time.time()
        machines.append(start(1))
        if not _until(lambda: _steps(out, 2, restarted), 240):
            return {"error": "the run did not grow back"}
        grow = min(_steps(out, 2, restarted)) - restarted
        (out / "pace").write_text("0.05")
        codes = [machines[0].wait(300), machines[2].wait(300)]
        return {"shrink_s": shrink, "grow_s": grow, "exit_codes": codes}
    finally:
        for rank in (0, 1):
            _kill_machine(f"{port}-{rank}")
        for process in machines:
            kill_tree(process.pid)


def periodic_cost(work: Path, rounds: int) -> dict:
    out = work / "periodic"
    command = [sys.executable, "-m", "hasten", "launch", "--num_processes", "2", str(HERE / "_periodic_train.py"),
               str(out), str(rounds), "60", "20"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800, env=_env("periodic"))
    if result.returncode != 0:
        return {"error": result.stderr[-2000:]}
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    pairs = [(a["seconds"], b["seconds"]) for a, b in zip(rows[::2], rows[1::2])][1:]  # round 0 warms up
    ratios = [with_saves / without for with_saves, without in pairs]
    saves = len(list((out / "checkpoints").glob("checkpoint_*")))
    return {"ratio": statistics.median(ratios), "ratios": ratios, "step_s": statistics.median(b for _, b in pairs) / 60,
            "checkpoints_kept": saves}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    engines = ["ddp"] if args.quick else ["ddp", "fsdp", "z2"]
    rounds = 1 if args.quick else 3
    with tempfile.TemporaryDirectory(prefix="hasten-elastic-bench-") as tmp:
        work = Path(tmp)
        port = 23100 + os.getpid() % 500
        for engine in engines:
            results = []
            for _ in range(rounds):
                port += 1
                results.append(recovery_round(engine, work, port))
            good = [r for r in results if "error" not in r]
            row = {"framework": "hasten", "engine": engine, "rounds": len(results),
                   "errors": [r["error"] for r in results if "error" in r],
                   "shrink_s": statistics.median(r["shrink_s"] for r in good) if good else None,
                   "grow_s": statistics.median(r["grow_s"] for r in good) if good else None,
                   "shrink_all": [round(r["shrink_s"], 1) for r in good], "grow_all": [round(r["grow_s"], 1) for r in good],
                   "finished": all(r.get("exit_codes") == [0, 0] for r in good) and len(good) == len(results)}
            print(f"elastic {engine}: shrink {row['shrink_all']} s, grow {row['grow_all']} s, "
                  f"finished {row['finished']}, errors {row['errors']}", flush=True)
            record("elastic", f"recovery {engine}", **row)
        cost = periodic_cost(work, 3 if args.quick else 6)
        print(f"periodic checkpoints every 20 steps (async), 2-process DDP: {cost}", flush=True)
        record("elastic", "periodic checkpoint cost", framework="hasten", **cost)


if __name__ == "__main__":
    main()
