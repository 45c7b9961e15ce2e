"""Elastic runs: how long a run stands still when it loses a machine or one returns, whether the run trains the
uninterrupted run's numbers, what dealing a step's micro-batches unevenly costs, and what periodic checkpoints cost.

    python benchmarks/elastic.py            # 3 rounds per engine and accumulation; 3 speed rounds; 6 save rounds
    python benchmarks/elastic.py --quick    # 1 round, DDP only; 1 speed round; 3 save rounds
    python benchmarks/elastic.py --only periodic   # one of the three parts below

1. Recovery. Two "machines" on this host (two `hasten launch --num_machines 1:2` commands, one process each,
   sharing a c10d endpoint on 127.0.0.1, torch's and hasten's default rendezvous settings) train
   `tests/scripts/elastic_train.py` with the script's gradient accumulation 1 and 3. After 6 steps machine 1's
   launcher and worker are SIGKILLed: *shrink* is the time from the kill to the first optimizer step on machine 0
   alone. After 2 steps alone machine 1's command starts again: *grow* is the time from that start to the first step
   on two machines. Each run finishes, and its final parameters are compared with those of the uninterrupted run
   (the same script on 2 processes of one plain launch): the largest difference relative to a tensor's largest value.
   The peers have no such mode: a run of Accelerate or Fabric that loses a machine ends, and a person starts it
   again by hand on the machines left (Accelerate refuses a different number of processes at resume).
2. The cost of the weighting. Two processes (two machines of one process) train `_elastic_speed_train.py`, an MLP
   of 6M parameters, in rounds that alternate three layouts of the same work per process (2 micro-batches a step):
   *uneven*, 2 of a `2:3` range (3 micro-batches a step: one process takes 2, the other 1); *even*, 2 of a `2:4`
   range (4: 2 each); *plain*, a fixed 2-process launch with `--gradient_accumulation_steps 2`. Steps per second,
   median over a round's steps, as ratios to *even*.
3. Periodic checkpoints. One 2-process DDP run (`_periodic_train.py`, an MLP of 6M parameters, one thread per
   process) alternates rounds of 60 steps with `save_every_n_steps=20` (asynchronous) and without, 12 of each, the
   saves in each round's middle (so a save's background write is timed in its own round): the ratio of the rounds'
   times, median over rounds, is what the saves cost the training loop; beside it the ratios of the CPU seconds
   (training threads; every thread), steadier on a shared VM. The same with a save every 40 and every 80 steps
   (rounds of 120 and 240 steps, 6 of each), to find the interval at which the cost is 1.01 here.
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
EPOCHS = {1: 3, 3: 6}  # by the script's accumulation: 36 and 24 optimizer steps


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


def until(condition, limit: float, every: float = 0.1) -> bool:
    """Whether `condition()` held within `limit` seconds (asked every `every` seconds)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(every)
    return False


def _script(out: Path, engine: str, accumulation: int) -> list[str]:
    return [str(SCRIPT), str(out), engine, "0.05", str(EPOCHS[accumulation]), str(accumulation), "2"]


def _final_difference(out: Path, reference: Path) -> float | None:
    from safetensors.torch import load_file

    try:
        final, expected = load_file(str(out / "final.safetensors")), load_file(str(reference / "final.safetensors"))
    except OSError:
        return None
    return max(((final[k] - expected[k]).abs().max() / expected[k].abs().max().clamp_min(1e-12)).item() for k in final)


def uninterrupted(engine: str, accumulation: int, work: Path) -> Path:
    """The run the elastic ones are compared with: the same script on 2 processes of one plain launch."""
    out = work / f"{engine}-{accumulation}-uninterrupted"
    out.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "hasten", "launch", "--num_processes", "2",
                    *_script(out, engine, accumulation)], capture_output=True, text=True, timeout=600,
                   env=_env("reference"))
    return out


def recovery_round(engine: str, accumulation: int, work: Path, port: int, reference: Path) -> dict:
    """One kill-and-return scenario; the seconds each change kept the run from training, and the final parameters."""
    out = work / f"{engine}-{accumulation}-{port}"
    out.mkdir(parents=True)
    command = [sys.executable, "-m", "hasten", "launch", "--num_machines", "1:2", "--num_processes", "2",
               "--main_process_ip", "127.0.0.1", "--main_process_port", str(port), "--max_restarts", "3",
               "--machine_rank", "{rank}", *_script(out, engine, accumulation)]

    def start(rank: int) -> subprocess.Popen:
        argv = [part.replace("{rank}", str(rank)) for part in command]
        return subprocess.Popen(argv, stdout=(out / f"m{rank}.log").open("a"), stderr=subprocess.STDOUT,
                                env=_env(f"{port}-{rank}"), start_new_session=True)

    machines = [start(0)]
    time.sleep(1.0)
    machines.append(start(1))
    try:
        if not until(lambda: len(_steps(out, 2, 0)) >= 12, 300):
            return {"error": "no steps on two machines"}
        (out / "pace").write_text("0.2")
        killed = time.time()
        _kill_machine(f"{port}-1")
        if not until(lambda: len(_steps(out, 1, killed)) >= 2, 240):
            return {"error": "the survivor did not step"}
        shrink = min(_steps(out, 1, killed)) - killed
        (out / "pace").write_text("0.5")
        restarted = time.time()
        machines.append(start(1))
        if not until(lambda: _steps(out, 2, restarted), 240):
            return {"error": "the run did not grow back"}
        grow = min(_steps(out, 2, restarted)) - restarted
        (out / "pace").write_text("0.02")
        codes = [machines[0].wait(300), machines[2].wait(300)]
        return {"shrink_s": shrink, "grow_s": grow, "exit_codes": codes,
                "final_difference": _final_difference(out, reference)}
    finally:
        for rank in (0, 1):
            _kill_machine(f"{port}-{rank}")
        for process in machines:
            kill_tree(process.pid)


def speed_round(work: Path, port: int, layout: str, steps: int) -> dict:
    """One run of `_elastic_speed_train.py` in `layout` (uneven, even, plain); the median seconds of a step."""
    out = work / f"speed-{layout}-{port}"
    out.mkdir(parents=True)
    train = [str(HERE / "_elastic_speed_train.py"), str(out), str(steps)]
    if layout == "plain":
        commands = [[sys.executable, "-m", "hasten", "launch", "--num_processes", "2", "--gradient_accumulation_steps",
                     "2", *train]]
    else:
        size = {"uneven": 3, "even": 4}[layout]
        commands = [[sys.executable, "-m", "hasten", "launch", "--num_machines", f"2:{size}", "--num_processes",
                     str(size), "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1", "--main_process_port",
                     str(port), "--rdzv_conf", "last_call_timeout=1", *train] for rank in (0, 1)]
    processes = []
    for command in commands:
        processes.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                          env=_env(f"speed-{port}"), start_new_session=True))
        time.sleep(0.5)
    try:
        output = processes[0].communicate(timeout=600)[0]
        for process in processes[1:]:
            process.wait(600)
    finally:
        for process in processes:
            kill_tree(process.pid)
    rows = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    if not rows:
        return {"error": f"{layout}: no result"}
    return {"step_s": statistics.median(rows[0]["step_seconds"]), "processes": rows[0]["processes"],
            "micro_batches": rows[0]["micro_batches"]}


def weighting_cost(work: Path, rounds: int, port: int) -> dict:
    """Alternating rounds of the three layouts; steps/s ratios to the even one, median over rounds."""
    layouts = ("uneven", "even", "plain")
    runs: dict[str, list[float]] = {layout: [] for layout in layouts}
    errors = []
    for _ in range(rounds):
        for layout in layouts:
            port += 1
            result = speed_round(work, port, layout, steps=30)
            if "error" in result:
                errors.append(result["error"])
            else:
                runs[layout].append(result["step_s"])
    if not all(runs.values()):
        return {"error": errors}
    ratios = {layout: [runs["even"][i] / runs[layout][i] for i in range(min(map(len, runs.values())))]
              for layout in ("uneven", "plain")}
    return {"step_s": {layout: statistics.median(values) for layout, values in runs.items()},
            "uneven_vs_even": statistics.median(ratios["uneven"]), "plain_vs_even": statistics.median(ratios["plain"]),
            "uneven_all": [round(r, 3) for r in ratios["uneven"]], "plain_all": [round(r, 3) for r in ratios["plain"]],
            # samples a step: 3 micro-batches (uneven) against 4 (even), at the same step time when it costs nothing
            "uneven_samples_vs_even": 0.75 * statistics.median(ratios["uneven"]), "errors": errors}


def periodic_cost(work: Path, rounds: int, every: int = 20) -> dict:
    """Rounds with a save every `every` optimizer steps against rounds without (each round 3 saves' worth of steps)."""
    out = work / f"periodic-{every}"
    steps = 3 * every
    command = [sys.executable, "-m", "hasten", "launch", "--num_processes", "2", str(HERE / "_periodic_train.py"),
               str(out), str(rounds), str(steps), str(every)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800, env=_env("periodic"))
    if result.returncode != 0:
        return {"error": result.stderr[-2000:]}
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    rounds_with, rounds_without = rows[::2][1:], rows[1::2][1:]  # round 0 warms up
    pairs = [(a["seconds"], b["seconds"]) for a, b in zip(rounds_with, rounds_without)]
    ratios = [with_saves / without for with_saves, without in pairs]
    saves = len(list((out / "checkpoints").glob("checkpoint_*")))

    def cpu(key: str) -> float:  # total over the rounds: steadier than a median of per-round ratios
        return sum(r[key] for r in rounds_with) / sum(r[key] for r in rounds_without)

    # accounted: the saves' own seconds over the rounds without them (steady where the wall clock is not)
    without = sum(r["seconds"] for r in rounds_without)
    on_path = sum(r["save_training_s"] for r in rounds_with)
    background_cpu = sum(r["save_background_cpu_s"] for r in rounds_with)
    return {"ratio": statistics.median(ratios), "ratios": ratios, "every": every,
            "training_cpu_ratio": cpu("main_cpu"), "all_threads_cpu_ratio": cpu("process_cpu"),
            "accounted_core_free": 1 + on_path / without, "accounted_cores_busy": 1 + (on_path + background_cpu) / without,
            "save_training_ms": 1000 * on_path / max(1, len(rounds_with) * 3),
            "save_copy_wait_ms": 1000 * sum(r["save_copy_wait_s"] for r in rounds_with) / max(1, len(rounds_with) * 3),
            "save_background_cpu_ms": 1000 * background_cpu / max(1, len(rounds_with) * 3),
            "step_s": statistics.median(b for _, b in pairs) / steps, "checkpoints_kept": saves}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=("recovery", "weighting", "periodic"), help="one of the three parts")
    args = parser.parse_args()
    wanted = {args.only} if args.only else {"recovery", "weighting", "periodic"}
    engines = ["ddp"] if args.quick else ["ddp", "fsdp", "z2"]
    rounds = 1 if args.quick else 3
    with tempfile.TemporaryDirectory(prefix="hasten-elastic-bench-") as tmp:
        work = Path(tmp)
        port = 23100 + os.getpid() % 500
        for engine in engines if "recovery" in wanted else ():
            for accumulation in (1, 3):
                reference = uninterrupted(engine, accumulation, work)
                results = []
                for _ in range(rounds):
                    port += 1
                    results.append(recovery_round(engine, accumulation, work, port, reference))
                good = [r for r in results if "error" not in r]
                differences = [r["final_difference"] for r in good if r.get("final_difference") is not None]
                row = {"framework": "hasten", "engine": engine, "accumulation": accumulation, "rounds": len(results),
                       "errors": [r["error"] for r in results if "error" in r],
                       "shrink_s": statistics.median(r["shrink_s"] for r in good) if good else None,
                       "grow_s": statistics.median(r["grow_s"] for r in good) if good else None,
                       "shrink_all": [round(r["shrink_s"], 1) for r in good],
                       "grow_all": [round(r["grow_s"], 1) for r in good],
                       "final_difference": max(differences) if len(differences) == len(good) and good else None,
                       "finished": all(r.get("exit_codes") == [0, 0] for r in good) and len(good) == len(results)}
                print(f"elastic {engine} accumulation {accumulation}: shrink {row['shrink_all']} s, grow "
                      f"{row['grow_all']} s, final parameters vs uninterrupted {row['final_difference']}, "
                      f"finished {row['finished']}, errors {row['errors']}", flush=True)
                record("elastic", f"recovery {engine} accumulation {accumulation}", **row)
        if "weighting" in wanted:
            speed = weighting_cost(work, 1 if args.quick else 3, port + 100)
            print(f"weighting cost, 2-process DDP (steps/s against 2 of a 2:4 range): {speed}", flush=True)
            record("elastic", "weighting cost", framework="hasten", **speed)
        for every in () if "periodic" not in wanted else (20,) if args.quick else (20, 40, 80):  # the setting, then where this machine gets to 1.01
            cost = periodic_cost(work, 3 if args.quick else 12 if every == 20 else 6, every)
            print(f"periodic checkpoints every {every} steps (async), 2-process DDP: {cost}", flush=True)
            record("elastic", "periodic checkpoint cost" + ("" if every == 20 else f", every {every}"),
                   framework="hasten", **cost)


if __name__ == "__main__":
    main()
