"""Recovery from a lost machine: torchft's own DDP example beside hasten's elastic run, in one invocation.

    python benchmarks/recovery.py            # 2 rounds of each
    python benchmarks/recovery.py --quick    # 1 round of each

Two "machines" on this host, one process each, gloo on loopback. Machine 1 is lost after its step 20 (every
process of it SIGKILLed), then its command starts again. For each run the figures are: *recovery*, the seconds
from the kill to the survivor's next optimizer step; *join*, the seconds from the new command to its first
optimizer step in the group of two; *steps redone*, optimizer steps the survivor trained again; *samples* dropped
(in the uninterrupted run, never trained) and trained twice.

- torchft 0.2.0 (`pip install torchft==0.2.0`): its example `train_ddp.py` (`_torchft_ddp.py`: the same wiring,
  an MLP on indexed synthetic samples instead of CIFAR-10, as torchvision does not install beside torch 2.13
  here), each machine a `torchrun --standalone` of one process, the lighthouse with its README's flags
  (`--min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 10000`, heartbeat timeout its default 5 s). Killed
  once between two steps and once inside a step (during the backward's all-reduce).
- hasten, checkpoint restarts (the default, `--elastic_recovery restart`): `benchmarks/elastic.py`'s recovery round
  (DDP, accumulation 1, `--num_machines 1:2`, torch's and hasten's default rendezvous settings), whose final
  parameters are compared with the uninterrupted run's.
- hasten, live recovery (`--elastic_recovery live`): `_hasten_live.py`, the example's model, data and batch written
  the Accelerate way, killed inside a step; its samples and final parameters are compared with the uninterrupted run
  of the same command on machine 0 alone (the same global batch of 16).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import elastic
from _launch import descendants
from _results import record

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE / "_torchft_ddp.py"
LIVE = HERE / "_hasten_live.py"
KILL_AT, STEPS, BATCH = 20, 90, 8  # the example's batch size; 90 committed steps a run


def _rows(log: Path) -> list[tuple[float, int, int, bool, int, list[str]]]:
    rows = []
    for line in log.read_text().splitlines() if log.exists() else ():
        parts = line.split()
        if line.startswith("STEP ") and len(parts) >= 7:
            rows.append((float(parts[1]), int(parts[2]), int(parts[3]), parts[4] == "1", int(parts[5]),
                         parts[6].split(",")))
    return rows


def _trained(*logs: Path) -> dict[str, int]:
    """How many times each sample was trained in the committed steps of `logs`."""
    trained: dict[str, int] = {}
    for row in (r for log in logs for r in _rows(log) if r[3]):
        for sample in row[5]:
            trained[sample] = trained.get(sample, 0) + 1
    return trained


def _until(condition, limit: float) -> bool:
    return elastic.until(condition, limit, every=0.02)  # finer than elastic.py's: the seconds measured here are short


def _kill(process: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """The process and all below it (torch's agent starts its workers in sessions of their own)."""
    for pid in [process.pid, *descendants(process.pid)]:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _uninterrupted_samples() -> set[str]:
    """What the example trains without a failure: on each replica group, the first STEPS batches of its shard."""
    import torch
    from torchft import DistributedSampler

    data = torch.utils.data.TensorDataset(torch.arange(64 * 1000))
    wanted: set[str] = set()
    for replica in range(2):
        order = list(DistributedSampler(data, replica_rank=replica, num_replica_groups=2, group_rank=0,
                                        num_replicas=1, shuffle=True))
        wanted |= {str(i) for i in order[:STEPS * BATCH]}
    return wanted


def torchft_round(work: Path, port: int, placement: str) -> dict:
    """One run of torchft's example: machine 1 SIGKILLed after its step KILL_AT (`placement`: between / inside a
    step), started again 2 s after the survivor's next step."""
    from torchft.coordination import LighthouseServer

    out = work / f"torchft-{placement}-{port}"
    out.mkdir(parents=True)
    lighthouse = LighthouseServer(bind=f"[::]:{port}", min_replicas=1, join_timeout_ms=10000, quorum_tick_ms=100,
                                  heartbeat_timeout_ms=5000)
    env = {**os.environ, "TORCHFT_LIGHTHOUSE": f"http://localhost:{port}", "OMP_NUM_THREADS": "1",
           "NUM_REPLICA_GROUPS": "2", "STEPS": str(STEPS), "RUST_LOG": "warn",
           "SLEEP_AT": "mid" if placement == "inside" else "between"}
    machines: list[subprocess.Popen] = []

    def start(replica: int, tag: str) -> tuple[subprocess.Popen, Path, float]:
        log = out / f"r{replica}.{tag}.log"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node=1",
                   str(EXAMPLE)]
        started = time.time()
        process = subprocess.Popen(command, env={**env, "REPLICA_GROUP_ID": str(replica)}, stdout=log.open("w"),
                                   stderr=subprocess.STDOUT, start_new_session=True)
        machines.append(process)
        return process, log, started

    try:
        survivor, log0, _ = start(0, "a")
        victim, log1, _ = start(1, "a")
        if not _until(lambda: any(r[2] >= KILL_AT and r[3] for r in _rows(log1)), 180):
            return {"error": "machine 1 never reached its step 20"}
        killed = time.time()
        _kill(victim)
        victim.wait()
        stepped = lambda: [r for r in _rows(log0) if r[0] > killed and r[3]]  # noqa: E731
        if not _until(lambda: stepped() or survivor.poll() is not None, 90) or not stepped():
            lines = log0.read_text().splitlines()  # the assertion that ended it, else the last error line
            errors = ([line.strip() for line in lines if "AssertionError" in line or "assert " in line]
                      or [line.strip() for line in lines if "Error" in line])[-1:]
            return {"recovery_s": None, "crashed": True, "survivor_exit": survivor.poll(), "error": errors}
        recovery = stepped()[0][0] - killed
        time.sleep(2.0)
        _, log1b, command_at = start(1, "b")
        joined = lambda: [r for r in _rows(log1b) if r[3] and r[4] == 2]  # noqa: E731
        join = joined()[0][0] - command_at if _until(joined, 90) else None
        _until(lambda: all(m.poll() is not None for m in (survivor, machines[-1])), 180)
        rows0 = _rows(log0)
        trained = _trained(log0, log1, log1b)
        redone = sum(1 for a, b in zip(rows0, rows0[1:]) if a[3] and b[3] and b[2] <= a[2])
        return {"recovery_s": recovery, "join_s": join, "crashed": False, "steps_redone": redone,
                "samples_dropped": len(_uninterrupted_samples() - set(trained)),
                "samples_twice": sum(1 for count in trained.values() if count > 1)}
    finally:
        for process in machines:
            _kill(process)
        lighthouse.shutdown()


def hasten_round(work: Path, port: int, reference: Path) -> dict:
    """benchmarks/elastic.py's recovery round (DDP, accumulation 1), with the steps the re-formation redid."""
    result = elastic.recovery_round("ddp", 1, work, port, reference)
    logs = "".join(path.read_text() for path in work.glob(f"ddp-1-{port}/m0.log"))
    redone = [int(n) for n in re.findall(r"(\d+) step\(s\) redone", logs)]
    return {"recovery_s": result.get("shrink_s"), "join_s": result.get("grow_s"), "crashed": "error" in result,
            "steps_redone": sum(redone) if redone else None,
            # every sample of the uninterrupted run is trained once (tests/test_elastic.py): the parameters show it
            "final_difference": result.get("final_difference"), "error": result.get("error")}


def _live_launch(out: Path, rank: int, port: int, tag: str) -> tuple[subprocess.Popen, Path, float]:
    log = out / f"m{rank}.{tag}.log"
    command = [sys.executable, "-m", "hasten", "launch", "--cpu", "--num_machines", "1:2", "--num_processes", "2",
               "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1", "--main_process_port", str(port),
               "--elastic_recovery", "live", str(LIVE)]
    env = {**os.environ, "OUT": str(out), "STEPS": str(STEPS), "RUST_LOG": "warn", "OMP_NUM_THREADS": "1"}
    started = time.time()
    process = subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                               start_new_session=True)
    return process, log, started


def live_reference(work: Path, port: int) -> Path:
    """The uninterrupted run of `_hasten_live.py`: machine 0 alone, dealing both micro-batches of every step."""
    out = work / "live-uninterrupted"
    out.mkdir(parents=True)
    process, log, _ = _live_launch(out, 0, port, "a")
    if process.wait(timeout=600) != 0:
        raise SystemExit(f"the uninterrupted live run failed:\n{log.read_text()[-3000:]}")
    return out


def hasten_live_round(work: Path, port: int, reference: Path) -> dict:
    """hasten with live recovery: machine 1 SIGKILLed inside its step after step KILL_AT, started again 2 s after the
    survivor's next step; samples and final parameters against the uninterrupted run."""
    import torch

    out = work / f"live-{port}"
    out.mkdir(parents=True)
    machines: list[subprocess.Popen] = []
    try:
        survivor, log0, _ = _live_launch(out, 0, port, "a")
        victim, log1, _ = _live_launch(out, 1, port, "a")
        machines += [survivor, victim]
        if not _until(lambda: any(r[2] >= KILL_AT and r[3] and r[4] == 2 for r in _rows(log1)), 180):
            return {"error": "machine 1 never reached its step 20 in the group of two", "crashed": True}
        time.sleep(0.05)  # into the next step (its pause before the backward is STEP_SLEEP)
        killed = time.time()
        _kill(victim)
        victim.wait()
        stepped = lambda: [r for r in _rows(log0) if r[0] > killed and r[3]]  # noqa: E731
        if not _until(lambda: stepped() or survivor.poll() is not None, 90) or not stepped():
            return {"recovery_s": None, "crashed": True, "error": log0.read_text().splitlines()[-1:]}
        recovery = stepped()[0][0] - killed
        time.sleep(2.0)
        joiner, log1b, command_at = _live_launch(out, 1, port, "b")
        machines.append(joiner)
        joined = lambda: [r for r in _rows(log1b) if r[3] and r[4] == 2]  # noqa: E731
        join = joined()[0][0] - command_at if _until(joined, 90) else None
        _until(lambda: survivor.poll() is not None and joiner.poll() is not None, 240)
        rows0 = _rows(log0)
        trained = _trained(log0, log1, log1b)
        wanted = {sample for r in _rows(reference / "m0.a.log") if r[3] for sample in r[5]}
        steps0 = [r[2] for r in rows0 if r[3]]
        expected = torch.load(next(reference.glob("final_*.pt")))
        finals = [torch.load(path) for path in out.glob("final_*.pt")]
        difference = max((float((f - expected).abs().max() / expected.abs().max()) for f in finals), default=None)
        return {"recovery_s": recovery, "join_s": join, "crashed": False,
                "steps_redone": len(steps0) - len(set(steps0)),
                "attempts_dealt_again": sum(1 for r in rows0 if not r[3]),
                "samples_dropped": len(wanted - set(trained)),
                "samples_twice": sum(1 for count in trained.values() if count > 1),
                "final_difference": difference}
    finally:
        for process in machines:
            _kill(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("RUST_LOG", "warn")  # the lighthouse (in this process) logs every quorum at INFO otherwise
    try:
        import torchft  # noqa: F401
    except ImportError:
        sys.exit("benchmarks/recovery.py runs torchft's example beside hasten: pip install torchft==0.2.0")
    rounds = 1 if args.quick else 2
    port = 24100 + os.getpid() % 400
    with tempfile.TemporaryDirectory(prefix="hasten-recovery-bench-") as tmp:
        work = Path(tmp)
        reference = elastic.uninterrupted("ddp", 1, work)
        port += 2
        live_ref = live_reference(work, port)
        for _ in range(rounds):  # alternating, so that machine noise hits both alike
            for name in ("torchft between steps", "torchft inside a step", "hasten live inside a step",
                         "hasten restart"):
                port += 2
                if name.startswith("hasten live"):
                    result = hasten_live_round(work, port, live_ref)
                elif name.startswith("hasten"):
                    result = hasten_round(work, port, reference)
                else:
                    result = torchft_round(work, port, name.split(" ", 1)[1].split()[0])
                print(f"{name}: {result}", flush=True)
                record("recovery", f"SIGKILL of machine 1 of 2, {name}", framework=name.split()[0], **result)


if __name__ == "__main__":
    main()
