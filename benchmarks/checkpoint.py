"""Checkpoint speed against the physical limit, and the cost of preemption and restarts.

    python benchmarks/checkpoint.py            # ~100M-parameter model + AdamW (about 1.2 GB per checkpoint)
    python benchmarks/checkpoint.py --quick    # a ~25M-parameter model, fewer rounds

Part 1, in one process, alternating in each round:
  disk       write the same number of bytes with os.write + fsync (sequential; the physical limit)
  torch.save the model's and the optimizer's state dicts into one file + fsync (what a hand-written loop does)
  save_state hasten's checkpoint (safetensors model, optimizer, RNG, manifest, fsync, atomic rename)
  load_state hasten's load (reads and checks everything, then restores)
  torch.load the torch.save file (weights_only=True) and load_state_dict on model and optimizer
Printed: seconds and MB/s (median of rounds), save_state / disk-limit and save_state / torch.save ratios, peak RSS.

Part 2, two real processes through `hasten launch` (tests/scripts/ckpt_train.py):
  preemption: SIGTERM to the launcher -> the launcher's exit (agree, save, leave)
  restart:    launch -> first training step, for a fresh run and for a run resuming from a checkpoint

Part 3, checksum cost (`--checksums` runs only this part): what the manifest's content hashes cost.
  hash throughput in memory (xxh3_128, zlib.crc32, sha256, blake2b) against the disk's write speed (os.write + fsync),
  then save_state + load_state of a ~200 MB state (a 16.8M-parameter model + AdamW) with the hashes on and off
  (hasten.checkpointing.integrity.ENABLED), alternating, median of rounds; loads from the page cache (hot: the
  worst case for the check, nothing to overlap it with) and, when run as root, after dropping the caches (cold).

Part 4, async-save stall (`--async-save` runs only this part), as a training loop feels it: the same 12 training
  steps of a 151 MB model + AdamW on one training thread, alternating in each round, with no save before them, after
  save_state(...) and after save_state(..., async_save=True) (its handle waited for after the steps). Printed: the
  time each save adds to the steps, and the asynchronous one's against the synchronous one's (goal <= 0.25).
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import record

ROOT = Path(__file__).resolve().parent.parent


def build(width: int, layers: int):
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()  # AdamW state exists: two tensors per parameter
    optimizer.zero_grad()
    return model, optimizer


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def disk_write(path: Path, nbytes: int) -> float:
    block = os.urandom(8 * 2**20)  # 8 MiB writes: bigger ones measured slower here (page-cache allocation)
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    written = 0
    while written < nbytes:
        written += os.write(fd, block[: min(len(block), nbytes - written)])
    os.fsync(fd)
    os.close(fd)
    took = time.perf_counter() - start
    path.unlink()
    return took


def drop_caches() -> bool:
    """Make loads read from disk where we may (root); otherwise they read the page cache (noted in the output)."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def hash_speeds(nbytes: int = 256 * 2**20) -> dict[str, float]:
    """MB/s of each candidate hash over `nbytes` in memory (best of 3)."""
    import hashlib
    import zlib

    data = os.urandom(nbytes)
    candidates = {"sha256": lambda: hashlib.sha256(data).digest(), "blake2b": lambda: hashlib.blake2b(data).digest(),
                  "zlib.crc32": lambda: zlib.crc32(data)}
    try:
        import xxhash

        candidates = {"xxh3_128": lambda: xxhash.xxh3_128(data).digest(), **candidates}
    except ImportError:
        pass
    speeds = {}
    for name, run in candidates.items():
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - start)
        speeds[name] = nbytes / 1e6 / best
    return speeds


def checksum_cost(rounds: int, work: Path) -> None:
    """Part 3: save_state + load_state of ~200 MB with the content hashes on and off."""
    from hasten import Accelerator
    from hasten.checkpointing import integrity

    speeds = hash_speeds()
    disk_bytes = 256 * 2**20
    disk = statistics.median(disk_write(work / "disk.bin", disk_bytes) for _ in range(3))
    print(f"-- checksum cost: hash throughput in memory vs the disk (os.write + fsync {disk_bytes / 1e6 / disk:.0f} MB/s)")
    for name, speed in speeds.items():
        print(f"{name:<11} {speed:7.0f} MB/s   {speed * disk / (disk_bytes / 1e6):5.1f}x the disk's write speed")
    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(*build(1024, 16))
    size = sum(p.numel() * p.element_size() for p in model.parameters()) * 3  # weights + AdamW's two moments
    cold = drop_caches()
    times: dict[tuple[str, bool], list[float]] = {(kind, on): [] for kind in ("save", "hot", "cold") for on in (True, False)}
    for round_index in range(rounds):
        for on in ((True, False) if round_index % 2 else (False, True)):  # alternate who goes first
            integrity.ENABLED = on
            ckpt = work / f"sum{round_index}{on}"
            os.sync()
            gc.collect()
            start = time.perf_counter()
            accelerator.save_state(ckpt)
            times[("save", on)].append(time.perf_counter() - start)
            for kind in ("hot", "cold") if cold else ("hot",):
                if kind == "cold":
                    drop_caches()
                gc.collect()
                start = time.perf_counter()
                accelerator.load_state(ckpt)
                times[(kind, on)].append(time.perf_counter() - start)
            shutil.rmtree(ckpt)
    integrity.ENABLED = True
    median = {key: statistics.median(value) for key, value in times.items() if value}
    print(f"-- save_state + load_state of {size / 1e6:.0f} MB, hashes on / off, median of {rounds} alternating rounds")
    figures = {}
    for kind in ("hot", "cold") if cold else ("hot",):
        on = median[("save", True)] + median[(kind, True)]
        off = median[("save", False)] + median[(kind, False)]
        figures[kind] = {"save_on_s": median[("save", True)], "save_off_s": median[("save", False)],
                         "load_on_s": median[(kind, True)], "load_off_s": median[(kind, False)], "ratio": on / off}
        print(f"{kind + ' cache':<10} save {median[('save', True)]:.3f} / {median[('save', False)]:.3f} s   "
              f"load {median[(kind, True)]:.3f} / {median[(kind, False)]:.3f} s   save+load with/without hashes "
              f"{on / off:.3f}x   (goal <= 1.10x)", flush=True)
    record("checkpoint", "checksum_cost", algorithm=integrity.ALGORITHM, mb=size / 1e6, rounds=rounds,
           disk_mb_s=disk_bytes / 1e6 / disk, hash_mb_s=speeds, **figures)


def async_stall(rounds: int, work: Path, steps: int = 12, training_threads: int = 1) -> None:
    """Part 4: what a save costs the training loop, synchronous and asynchronous, as the loop feels it.

    The same `steps` training steps, alternating in each round: with no save before them, after
    save_state(...) and after save_state(..., async_save=True) (whose handle is waited for after the steps, so an
    unfinished save counts too). A save's stall is its time minus the no-save time. The model is the issue's: 151 MB
    of weights + AdamW (453 MB of state), one training thread (torch.set_num_threads(1)) on this machine.
    """
    import torch

    from hasten import Accelerator

    threads = torch.get_num_threads()
    torch.set_num_threads(training_threads)
    try:
        accelerator = Accelerator(cpu=True)
        model, optimizer = accelerator.prepare(*build(2048, 9))
        size = sum(p.numel() * p.element_size() for p in model.parameters()) * 3
        batch = torch.randn(16, 2048)

        def train(count: int) -> None:
            for _ in range(count):
                accelerator.backward(model(batch).square().mean())
                optimizer.step()
                optimizer.zero_grad()

        train(2)
        seconds: dict[str, list[float]] = {"none": [], "sync": [], "async": []}
        for round_index in range(rounds):
            kinds = ["none", "sync", "async"]
            for kind in kinds[round_index % 3:] + kinds[:round_index % 3]:
                ckpt = work / f"stall{round_index}{kind}"
                os.sync()
                gc.collect()
                start = time.perf_counter()
                handle = None if kind == "none" else accelerator.save_state(ckpt, async_save=kind == "async")
                train(steps)
                if kind == "async":
                    handle.wait()  # type: ignore[union-attr]
                seconds[kind].append(time.perf_counter() - start)
                shutil.rmtree(ckpt, ignore_errors=True)
    finally:
        torch.set_num_threads(threads)
    median = {kind: statistics.median(values) for kind, values in seconds.items()}
    sync_stall, async_stall_s = median["sync"] - median["none"], median["async"] - median["none"]
    ratio = async_stall_s / sync_stall
    print(f"-- save of {size / 1e6:.0f} MB (151 MB model + AdamW), {training_threads} training thread(s) on "
          f"{os.cpu_count()} cores, {steps} steps after it "
          f"({median['none']:.2f} s without a save), median of {rounds} alternating rounds: the loop loses "
          f"{sync_stall:.3f} s to a synchronous save, {async_stall_s:.3f} s to an asynchronous one: "
          f"{ratio:.3f}x (goal <= 0.25x, never above 1)", flush=True)
    record("checkpoint", "async_save_stall", mb=size / 1e6, rounds=rounds, steps=steps, threads=training_threads,
           none_s=median["none"],
           sync_stall_s=sync_stall, async_stall_s=async_stall_s, ratio=ratio)


def part1(width: int, layers: int, rounds: int, work: Path) -> None:
    import torch

    from hasten import Accelerator

    accelerator = Accelerator(cpu=True)
    model, optimizer = build(width, layers)
    model, optimizer = accelerator.prepare(model, optimizer)
    params = sum(p.numel() for p in model.parameters())
    times: dict[str, list[float]] = {k: [] for k in ("disk", "torch.save", "save_state", "load_state", "torch.load")}
    sizes: dict[str, int] = {}
    for round_index in range(rounds):
        ckpt, plain = work / f"ckpt{round_index}", work / f"plain{round_index}.pt"

        def hasten_save() -> None:
            start = time.perf_counter()
            accelerator.save_state(ckpt)
            times["save_state"].append(time.perf_counter() - start)
            sizes["save_state"] = sum(p.stat().st_size for p in ckpt.iterdir())

        def torch_save() -> None:
            start = time.perf_counter()
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, plain)
            fsync(plain)
            times["torch.save"].append(time.perf_counter() - start)
            sizes["torch.save"] = plain.stat().st_size

        def disk() -> None:
            times["disk"].append(disk_write(work / "disk.bin", sizes.get("save_state", 1_208_000_000)))

        writers = [hasten_save, torch_save, disk]
        shift = round_index % len(writers)  # rotate who goes first: page-cache state favours no one
        for write in writers[shift:] + writers[:shift]:
            os.sync()
            gc.collect()
            write()
        drop_caches()
        gc.collect()
        start = time.perf_counter()
        accelerator.load_state(ckpt)
        times["load_state"].append(time.perf_counter() - start)
        drop_caches()
        gc.collect()
        start = time.perf_counter()
        state = torch.load(plain, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        del state
        times["torch.load"].append(time.perf_counter() - start)
        shutil.rmtree(ckpt)
        plain.unlink()
    median = {k: statistics.median(v) for k, v in times.items()}
    mb = sizes["save_state"] / 1e6
    print(f"-- checkpoint of {params / 1e6:.1f}M parameters + AdamW state: save_state writes {mb:.0f} MB "
          f"(torch.save {sizes['torch.save'] / 1e6:.0f} MB); median of {rounds} alternating rounds")
    for name, seconds in median.items():
        size = sizes["torch.save" if name.startswith("torch") else "save_state"] / 1e6
        print(f"{name:<11} {seconds:7.2f} s   {size / seconds:7.0f} MB/s")
    print(f"save_state / disk limit   {median['save_state'] / median['disk']:.2f}x   (1.00 = as fast as the disk writes)")
    print(f"save_state / torch.save   {median['save_state'] / median['torch.save']:.2f}x")
    print(f"load_state / torch.load   {median['load_state'] / median['torch.load']:.2f}x   "
          f"(load_state also checks every file, key and shape first)")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB "
          f"(model + optimizer alone: {mb:.0f} MB)", flush=True)
    for name, seconds in median.items():
        size = sizes["torch.save" if name.startswith("torch") else "save_state"]
        record("checkpoint", name, params_m=params / 1e6, rounds=rounds, seconds=seconds, mb=size / 1e6,
               mb_s=size / 1e6 / seconds)
    record("checkpoint", "ratios", params_m=params / 1e6, save_vs_disk=median["save_state"] / median["disk"],
           save_vs_torch_save=median["save_state"] / median["torch.save"],
           load_vs_torch_load=median["load_state"] / median["torch.load"],
           peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def _first_step_seconds(out: Path, wall_start: float, process: subprocess.Popen, timeout: float = 120) -> float:
    """Seconds from `wall_start` until the run writes its first loss (the script writes one after each step)."""
    losses = out / "losses_rank0.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if losses.exists() and losses.stat().st_mtime > wall_start:
            return time.time() - wall_start
        time.sleep(0.01)
    raise RuntimeError("the run did not reach its first step")


def part2(rounds: int, work: Path) -> None:
    script = ROOT / "tests" / "scripts" / "ckpt_train.py"
    exits, fresh_starts, resumed_starts = [], [], []
    for round_index in range(rounds):
        out = work / f"run{round_index}"
        out.mkdir()
        command = [sys.executable, "-m", "hasten", "launch", "--num_processes", "2", str(script), str(out),
                   "--sleep", "0.1", "--save-every", "1000", "--epochs", "50"]
        wall_start = time.time()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
        fresh_starts.append(_first_step_seconds(out, wall_start, process))
        time.sleep(1.0)
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
        exits.append(time.monotonic() - sent)
        assert process.returncode == 75, stderr
        wall_start = time.time()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        resumed_starts.append(_first_step_seconds(out, wall_start, process))
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    print(f"-- 2 processes (gloo), median of {rounds}")
    print(f"preemption signal -> clean exit of the launcher   {statistics.median(exits):.2f} s "
          f"(all ranks agree, save, leave; grace period 30 s)")
    print(f"launch -> first step, fresh run                    {statistics.median(fresh_starts):.2f} s")
    print(f"launch -> first resumed step, after preemption     {statistics.median(resumed_starts):.2f} s", flush=True)
    record("checkpoint", "restart", rounds=rounds, preemption_exit_s=statistics.median(exits),
           fresh_first_step_s=statistics.median(fresh_starts), resumed_first_step_s=statistics.median(resumed_starts))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--checksums", action="store_true", help="run only part 3, the checksum cost")
    parser.add_argument("--async-save", action="store_true", help="run only part 4, the async-save stall")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hasten-bench-", dir=os.environ.get("HASTEN_BENCH_DIR")))
    try:
        if args.checksums:
            checksum_cost(rounds=4 if args.quick else 10, work=work)
        elif args.async_save:
            async_stall(rounds=4 if args.quick else 10, work=work)
        elif args.quick:
            part1(width=2048, layers=6, rounds=2, work=work)
            part2(rounds=2, work=work)
            checksum_cost(rounds=4, work=work)
            async_stall(rounds=4, work=work)
        else:
            part1(width=4096, layers=6, rounds=6, work=work)
            part2(rounds=3, work=work)
            checksum_cost(rounds=10, work=work)
            async_stall(rounds=10, work=work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
