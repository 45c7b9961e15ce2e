"""Faults, side by side: exact resume after SIGKILL, preemption by SIGTERM, a hang (a skipped barrier), a frozen rank
(SIGSTOP) and a rank that returns early.

    python benchmarks/faults.py            # hasten, and Accelerate / Lightning Fabric when installed here
    python benchmarks/faults.py --quick    # the same cases; the peers' hang is given 30 s instead of 60 s
    python benchmarks/faults.py --liveness # only the frozen rank and the early return

What the test suite establishes for hasten (tests/test_resume.py, tests/test_launch_signals.py,
tests/test_watchdog.py), shown here once per behaviour on 2 real processes (gloo), each case well
under a minute, and the same case for each peer installed in this environment, written the peer's
documented way and started by its own launcher (`accelerate launch`; torchrun for Fabric):

- exact resume: an uninterrupted run (dropout, shuffling, AdamW, a scheduler, accumulation 2,
  a checkpoint every 4 steps), then the same run with rank 1 SIGKILLed after step 7 and started
  again: are the per-step losses (float.hex) and the final parameters those of the uninterrupted run?
  Then the same without dropout (no random numbers drawn after the restore but the shuffle's).
- preemption: SIGTERM to the launcher after a few steps (what a scheduler sends): exit code, seconds
  to exit, whether a checkpoint was saved at the signal, how many steps the restart redoes, and
  whether the restarted run ends bit-identical to the uninterrupted one.
- hang: rank 0 waits in a barrier while rank 1 is already in a gather (default 30-minute timeout):
  does the run end by itself, how fast, and does its error name both ranks and where they wait?
  The peers get a fixed limit (60 s, 30 s with --quick), after which the run is killed.
- frozen rank: both ranks gather in a loop; rank 1 gets SIGSTOP (a stuck driver, a hung read, a paused VM). Does
  the run end by itself (hasten: at its default 45 s liveness limit), naming rank 1 and its pid, and is every
  process gone afterwards, the stopped one included?
- early return: rank 1 returns from main while rank 0 goes on to a gather. How soon does the run end, and does
  the message say who left?

The training scripts are benchmarks/_faults_train.py (hasten and Accelerate: only the imports
differ) and benchmarks/_faults_train_fabric.py (the same training written for Fabric).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _launch import descendants, kill_tree
from _results import record

HERE = Path(__file__).resolve().parent
TRAIN = {"hasten": HERE / "_faults_train.py", "accelerate": HERE / "_faults_train.py",
         "fabric": HERE / "_faults_train_fabric.py"}
KILL_AT = 7  # after a checkpoint (step 4) and before the next (step 8)

HANG = {
    "hasten": """\
import torch
from hasten import Accelerator
accelerator = Accelerator(cpu=True)
if accelerator.process_index == 0:
    accelerator.wait_for_everyone()  # rank 0 waits here ...
accelerator.gather(torch.ones(3))  # ... while rank 1 is already here
print("UNREACHABLE", flush=True)
""",
    "fabric": """\
import torch
from lightning.fabric import Fabric
fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
if fabric.global_rank == 0:
    fabric.barrier()  # rank 0 waits here ...
fabric.all_gather(torch.ones(3))  # ... while rank 1 is already here
print("UNREACHABLE", flush=True)
""",
}
HANG["accelerate"] = HANG["hasten"].replace("from hasten import", "from accelerate import")

# Liveness: every rank gathers in a loop and, a few steps in, writes its pid; the benchmark then freezes rank 1.
FREEZE = """\
import os, sys, time
from pathlib import Path
import torch
from hasten import Accelerator
accelerator = Accelerator(cpu=True)
for step in range(100_000):
    accelerator.gather(torch.ones(1))
    if step == 5:
        Path(sys.argv[1], f"ready.rank{accelerator.process_index}").write_text(str(os.getpid()))
    time.sleep(0.05)
"""
# A rank that returns from main while the other goes on to a gather.
LEAVE = """\
import time
import torch
from hasten import Accelerator
def main():
    accelerator = Accelerator(cpu=True)
    accelerator.gather(torch.ones(1))
    if accelerator.process_index == 1:
        print(f"LEFT {time.time():.3f}", flush=True)
        return  # rank 1 is done ...
    accelerator.gather(torch.ones(3))  # ... while rank 0 gathers
    print("UNREACHABLE", flush=True)
main()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launcher(framework: str) -> list[str]:
    """How each framework starts 2 processes on this machine."""
    if framework == "hasten":
        return [sys.executable, "-m", "hasten", "launch", "--num_processes", "2"]
    if framework == "accelerate":  # --multi_gpu is the 2-process launch; the scripts' cpu=True makes it multi-CPU
        return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", str(free_port())]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={free_port()}"]


def start(framework: str, script: Path, *args: str, home: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "HF_HOME": str(home)}  # `accelerate launch` reads no config file of this machine's user
    return subprocess.Popen([*launcher(framework), str(script), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True, cwd=HERE.parent)


def finish(process: subprocess.Popen, timeout: float) -> tuple[int | None, str, str]:
    """Wait at most `timeout` s; on timeout kill the whole session and return code None."""
    try:
        out, err = process.communicate(timeout=timeout)
        return process.returncode, out, err
    except subprocess.TimeoutExpired:
        kill_tree(process.pid)
        out, err = process.communicate()
        return None, out, err


def train(framework: str, out: Path, *args: str, home: Path, timeout: float = 120) -> tuple[int | None, str]:
    out.mkdir(parents=True, exist_ok=True)
    code, _, err = finish(start(framework, TRAIN[framework], str(out), "--framework", framework, *args, home=home),
                          timeout)
    return code, err


def losses(out: Path, rank: int) -> dict[str, str]:
    try:
        return json.loads((out / f"losses_rank{rank}.json").read_text())
    except (OSError, ValueError):
        return {}


def compare(reference: Path, run: Path) -> tuple[bool, str]:
    """Bit-for-bit comparison of two finished runs (both ranks): (identical, what differs)."""
    first, differing, total, param_diff = None, 0, 0, 0.0
    for rank in (0, 1):
        if not (run / f"final_rank{rank}.pt").exists():
            return False, f"rank {rank} did not finish"
        a, b = losses(reference, rank), losses(run, rank)
        bad = sorted(int(k) for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        if bad:
            first = min(first or bad[0], bad[0])
        differing, total = max(differing, len(bad)), len(a)
        pa = torch.load(reference / f"final_rank{rank}.pt", weights_only=True)
        pb = torch.load(run / f"final_rank{rank}.pt", weights_only=True)
        param_diff = max(param_diff, max((pa[k] - pb[k]).abs().max().item() for k in pa))
    if first is None and param_diff == 0:
        return True, ""
    losses_text = (f"losses differ from step {first} on ({differing} of {total} steps)" if first is not None
                   else "losses equal")
    return False, f"{losses_text}, final parameters by up to {param_diff:.1e}"


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def tail(text: str, lines: int = 3) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip() and "real_accelerator.py" not in line]
    return " / ".join(line.strip()[:200] for line in kept[-lines:])


# ---------------------------------------------------------------------------- the cases
def exact_resume(framework: str, work: Path, home: Path, dropout: bool = True) -> Path | None:
    behaviour = "exact resume after SIGKILL" + ("" if dropout else ", model without dropout")
    extra = () if dropout else ("--dropout", "0")
    reference = work / f"{framework}-reference{'' if dropout else '-no-dropout'}"
    started = time.monotonic()
    code, err = train(framework, reference, *extra, home=home)
    if code != 0:
        outcome = f"the uninterrupted run failed (exit {code}): {tail(err)}"
        print(f"  {framework:<10} {behaviour}: {outcome}", flush=True)
        record("faults", behaviour, framework=framework, holds=False, outcome=outcome)
        return None
    run = work / f"{framework}-killed{'' if dropout else '-no-dropout'}"
    killed, _ = train(framework, run, "--kill-at", str(KILL_AT), "--kill-rank", "1", *extra, home=home)
    code, err = train(framework, run, *extra, home=home)
    seconds = time.monotonic() - started
    if code != 0:
        identical, detail = False, f"the restarted run failed (exit {code}): {tail(err)}"
    else:
        identical, detail = compare(reference, run)
    done = json.loads((run / "done_rank0.json").read_text()) if (run / "done_rank0.json").exists() else {}
    where = (f"rank 1 SIGKILLed after step {KILL_AT} (launcher exit {killed}); restarted from "
             f"{done.get('resumed_from')} (step {done.get('resumed_at_step')})")
    steps = len(losses(reference, 0))
    outcome = (f"bit-identical: losses of all {steps} steps and final parameters equal, both ranks" if identical
               else f"NOT bit-identical: {detail}") + f" ({where})"
    print(f"  {framework:<10} {behaviour}: {outcome}  [{seconds:.0f} s for 3 runs]", flush=True)
    record("faults", behaviour, framework=framework, holds=identical, outcome=outcome,
           seconds=seconds, launcher_exit=killed)
    return reference


def preemption(framework: str, work: Path, home: Path, reference: Path | None) -> None:
    run = work / f"{framework}-preempted"
    run.mkdir(parents=True)
    process = start(framework, TRAIN[framework], str(run), "--framework", framework, "--sleep", "0.2", home=home)
    deadline = time.monotonic() + 90
    while len(losses(run, 0)) < 5 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    checkpoints = run / "project" / "checkpoints"
    before = {p.name for p in checkpoints.iterdir()} if checkpoints.is_dir() else set()
    ranks = descendants(process.pid)
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)  # the launcher only, as a scheduler does
    code, _, err = finish(process, 60)
    exit_seconds = time.monotonic() - sent
    time.sleep(1)
    left = [pid for pid in ranks if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    done_at_exit = max(len(losses(run, 0)), len(losses(run, 1)))
    after = {p.name for p in checkpoints.iterdir() if not p.name.startswith(".")} if checkpoints.is_dir() else set()
    saved_at_signal = sorted(after - before)
    code2, err2 = train(framework, run, home=home)
    done = json.loads((run / "done_rank0.json").read_text()) if (run / "done_rank0.json").exists() else {}
    redone = done_at_exit - done["resumed_at_step"] if "resumed_at_step" in done else None
    if code2 != 0:
        identical, detail = False, f"the restarted run failed (exit {code2}): {tail(err2)}"
    elif reference is None:
        identical, detail = False, "no uninterrupted run to compare with"
    else:
        identical, detail = compare(reference, run)
    exit_text = "still running after 60 s, killed" if code is None else f"exit {code} after {exit_seconds:.1f} s"
    if left:
        exit_text += f", {len(left)} of its processes left running (killed)"
    outcome = (f"{exit_text}; " + (f"checkpoint written after the signal: {', '.join(saved_at_signal)}" if saved_at_signal
                                   else "no checkpoint written after the signal")
               + f"; the restart redid {redone} of the {done_at_exit} steps done"
               + ("; ends bit-identical" if identical else f"; NOT bit-identical: {detail}"))
    holds = code is not None and not left and redone == 0 and identical
    print(f"  {framework:<10} preemption: {outcome}", flush=True)
    record("faults", "preemption (SIGTERM to the launcher)", framework=framework, holds=holds, outcome=outcome,
           exit_code=code, exit_seconds=exit_seconds, left_running=len(left), written_after_signal=saved_at_signal,
           steps_redone=redone,
           identical=identical, launcher_output=tail(err))


def hang(framework: str, work: Path, home: Path, limit: float) -> None:
    script = work / f"skip_barrier_{framework}.py"
    script.write_text(HANG[framework])
    started = time.monotonic()
    code, out, err = finish(start(framework, script, home=home), limit)
    seconds = time.monotonic() - started
    summary = [line for line in err.splitlines() if line.startswith("hasten launch:")]
    # hasten's one-line summary, from the error's name to the end of its sentence
    text = summary[0].split("failed with ", 1)[-1].split(" (traceback above)")[0] if summary else tail(err, 2)
    names_both = "rank 0 waits in" in text and "rank 1 waits in" in text
    if code is None:
        outcome = f"still hanging after {limit:.0f} s, killed"
    elif "UNREACHABLE" in out:
        outcome = f"went past the skipped barrier (exit {code} after {seconds:.1f} s)"
    else:
        outcome = (f"ended by itself after {seconds:.1f} s, exit {code}; "
                   + ("names both ranks and where they wait" if names_both else "does not say where each rank waits")
                   + f": {text[:400]}")
    holds = code is not None and "UNREACHABLE" not in out and names_both and seconds < 60
    print(f"  {framework:<10} hang: {outcome}", flush=True)
    record("faults", "hang (rank 1 skips a barrier)", framework=framework, holds=holds, outcome=outcome,
           seconds=seconds, ended=code is not None, exit_code=code)


def frozen_rank(framework: str, work: Path, home: Path, limit: float) -> None:
    """SIGSTOP rank 1 while both gather in a loop (default settings): does the run end, naming it, leaving nothing?"""
    script, out = work / f"freeze_{framework}.py", work / f"freeze-{framework}"
    script.write_text(FREEZE.replace("from hasten import", f"from {framework} import"))
    out.mkdir()
    process = start(framework, script, str(out), home=home)
    deadline = time.monotonic() + 120
    while not (out / "ready.rank1").is_file() or not (out / "ready.rank1").read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if not (out / "ready.rank1").is_file():
        kill_tree(process.pid)
        record("faults", "a frozen rank (SIGSTOP)", framework=framework, holds=False, outcome="did not start")
        return
    ranks = descendants(process.pid)
    pid = int((out / "ready.rank1").read_text())
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        _, err = process.communicate(timeout=limit)
        code: int | None = process.returncode
    except subprocess.TimeoutExpired:  # as a user would: SIGTERM to the launcher, then see what is left
        code = None
        process.send_signal(signal.SIGTERM)
        try:
            _, err = process.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            kill_tree(process.pid)
            _, err = process.communicate()
    seconds = time.monotonic() - stopped
    time.sleep(1)
    left = [p for p in {*ranks, pid} if alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    summary = [line for line in err.splitlines() if line.startswith("hasten launch:")]
    text = summary[0].removeprefix("hasten launch: ") if summary else tail(err, 2)
    named = f"pid {pid}" in text and "rank 1" in text
    outcome = (f"still hanging after {limit:.0f} s, then SIGTERM to the launcher" if code is None
               else f"ended by itself {seconds:.1f} s after the freeze, exit {code}; "
               + ("names the frozen rank and its pid" if named else "does not name the frozen rank") + f": {text[:300]}")
    outcome += f"; {len(left)} process(es) left running (killed)" if left else "; no process left"
    holds = code not in (None, 0) and named and not left and seconds < 60
    print(f"  {framework:<10} frozen rank: {outcome}", flush=True)
    record("faults", "a frozen rank (SIGSTOP)", framework=framework, holds=holds, outcome=outcome, seconds=seconds,
           ended=code is not None, exit_code=code, left_running=len(left))


def early_return(framework: str, work: Path, home: Path, limit: float) -> None:
    """Rank 1 returns from main while rank 0 gathers: how soon does the run end, and does it say who left?"""
    script = work / f"leave_{framework}.py"
    script.write_text(LEAVE.replace("from hasten import", f"from {framework} import"))
    code, out, err = finish(start(framework, script, home=home), limit)
    ended = time.time()
    left_at = re.search(r"LEFT (\d+\.\d+)", out)
    seconds = ended - float(left_at.group(1)) if left_at else float("nan")
    summary = [line for line in err.splitlines() if line.startswith("hasten launch:")]
    text = summary[0].removeprefix("hasten launch: ") if summary else tail(err, 2)
    named = "rank 1" in text and "left" in text
    outcome = (f"still hanging after {limit:.0f} s, killed" if code is None
               else f"ended {seconds:.1f} s after rank 1 returned, exit {code}; "
               + ("names who left and where rank 0 waits" if named else "does not say who left") + f": {text[:300]}")
    holds = code not in (None, 0) and named and seconds < 30
    print(f"  {framework:<10} early return: {outcome}", flush=True)
    record("faults", "rank 1 returns early while rank 0 gathers", framework=framework, holds=holds, outcome=outcome,
           seconds=seconds, ended=code is not None, exit_code=code)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the peers' hang is given 30 s instead of 60 s")
    parser.add_argument("--liveness", action="store_true", help="only the frozen rank and the early return")
    args = parser.parse_args()
    frameworks = ["hasten"]
    if importlib.util.find_spec("accelerate") is not None:
        frameworks.append("accelerate")
    if importlib.util.find_spec("lightning") is not None:
        frameworks.append("fabric")
    work = Path(tempfile.mkdtemp(prefix="hasten-faults-"))
    home = work / "hf_home"
    try:
        print(f"-- faults, 2 processes (gloo); frameworks: {', '.join(frameworks)}", flush=True)
        references: dict[str, Path | None] = {}
        for framework in frameworks if not args.liveness else ():
            references[framework] = exact_resume(framework, work, home)
        for framework in frameworks if not args.liveness else ():  # a difference above: the random stream?
            exact_resume(framework, work, home, dropout=False)
        for framework in frameworks if not args.liveness else ():
            preemption(framework, work, home, references[framework])
        for framework in frameworks if not args.liveness else ():
            hang(framework, work, home, limit=90 if framework == "hasten" else (30 if args.quick else 60))
        for framework in frameworks:  # hasten at its default liveness limit (45 s)
            frozen_rank(framework, work, home, limit=90 if framework == "hasten" else (30 if args.quick else 60))
        for framework in frameworks:
            early_return(framework, work, home, limit=60)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
