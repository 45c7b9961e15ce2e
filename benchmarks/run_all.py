"""Run every benchmark in benchmarks/ and write benchmarks/RESULTS.md and benchmarks/results.png.

    python benchmarks/run_all.py            # the full run: the figures to commit (tens of minutes on 2 CPU cores)
    python benchmarks/run_all.py --quick    # every script with --quick: minutes, noisier

Run it with a Python that has the peers installed (Hugging Face Accelerate, Lightning Fabric) to
measure them side by side with hasten: every peer figure is taken in the same run, alternating
with hasten's and the raw PyTorch baseline's. hasten never needs the peers; without them their
columns say so.

Each script runs in its own process, one after the other, with its own time limit, and appends its
figures as JSON lines to the file named by HASTEN_BENCH_RESULTS (see _results.py); the command
keeps them in benchmarks/results.jsonl next to RESULTS.md, together with the machine, the versions
and each script's console output. `--from-results FILE` writes RESULTS.md and the chart again from
such a file without running anything.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# script, timeout (s) for the full run, timeout with --quick, module it needs (or None)
BENCHMARKS = [
    ("overhead.py", 7200, 1800, None),
    ("launch.py", 2400, 900, None),
    ("checkpoint.py", 3600, 900, None),
    ("sharded.py", 3600, 1200, None),
    ("deepspeed_steps.py", 3600, 1200, "deepspeed"),
    ("big_model.py", 3600, 1200, None),
    ("faults.py", 1800, 900, None),
    ("compile.py", 1800, 600, None),
    ("fp8.py", 1800, 600, "torchao"),
    ("elastic.py", 3600, 1200, None),
    ("recovery.py", 1800, 900, "torchft"),
]
from _chart import chart  # noqa: E402
from _render import PEERS, once, render  # noqa: E402


# ---------------------------------------------------------------------------- machine and versions
def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30, check=False,
                              env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"}).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = int(line.split()[1]) * 1024
    except OSError:
        pass
    os_name = platform.platform()
    try:
        release = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line)
        os_name += f" ({release.get('PRETTY_NAME', '').strip(chr(34))})"
    except OSError:
        pass
    commit = _git("rev-parse", "--short", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    return {
        "cpu": cpu, "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "ram_gib": ram / 2**30 if ram else None, "os": os_name,
        "python": f"{platform.python_version()} ({sys.executable})",
        "versions": {name: _version(name) for name in ("torch", "hasten", "accelerate", "lightning", "deepspeed",
                                                       "safetensors", "matplotlib")},
        "hasten_commit": (commit + (" + uncommitted changes" if dirty else "")) if commit else None,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


# ---------------------------------------------------------------------------- running
def run_script(script: str, args: list[str], timeout: float, index: int, total: int) -> tuple[int | None, float, str]:
    """Run one benchmark, echoing its output as it comes; returns (exit code or None on timeout, seconds, output)."""
    command = [sys.executable, str(HERE / script), *args]
    print(f"\n==> [{index}/{total}] {script} {' '.join(args)}  (time limit {timeout:.0f} s)", flush=True)
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                               start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []

    def pump() -> None:
        for line in process.stdout:
            lines.append(line)
            sys.stdout.write(line)
            sys.stdout.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        from _launch import kill_tree

        kill_tree(process.pid)  # the script and every process it started
        process.wait()
        code = None
    reader.join(timeout=10)
    seconds = time.monotonic() - started
    print(f"<== {script}: {'TIMED OUT, killed' if code is None else f'exit {code}'} after {seconds:.0f} s", flush=True)
    return code, seconds, "".join(lines)


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def merge(new: list[dict], old: list[dict], rerun: set[str]) -> list[dict]:
    """This run's records, then the previous run's records of every script this run did not run.

    A script's records are those written before its ``_run`` record (scripts run one after the other);
    the new ``_meta`` record names the scripts kept and the run they come from.
    """
    kept: list[dict] = []
    group: list[dict] = []
    old_meta = next((r for r in old if r["section"] == "_meta"), {})
    # where each kept script's figures come from: the previous run, or the older run that one kept them from
    origins = [{"scripts": [], "date": old_meta.get("date"), "commit": old_meta.get("hasten_commit"),
                "command": old_meta.get("command")}]
    earlier = old_meta.get("kept") or []
    origins += [{**o, "scripts": []} for o in ([earlier] if isinstance(earlier, dict) else earlier)]
    earlier_of = {name: i + 1 for i, o in enumerate([earlier] if isinstance(earlier, dict) else earlier)
                  for name in o.get("scripts", ())}
    for record in old:
        if record["section"] == "_meta":
            continue
        group.append(record)
        if record["section"] == "_run":
            if record["name"] not in rerun:
                kept += group
                origins[earlier_of.get(record["name"], 0)]["scripts"].append(record["name"])
            group = []
    meta = next(r for r in new if r["section"] == "_meta")
    meta["kept"] = [o for o in origins if o["scripts"]]
    if kept:  # the kept figures hold the peers measured then: a peer absent now keeps its columns and its version
        for peer, present in old_meta.get("peers", {}).items():
            meta.setdefault("peers", {})[peer] = meta["peers"].get(peer) or present
        for package, version in old_meta.get("versions", {}).items():
            if version and not meta.setdefault("versions", {}).get(package):
                meta["versions"][package] = version
    return new + kept


# ---------------------------------------------------------------------------- main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="every script with --quick (minutes, noisier)")
    parser.add_argument("--only", nargs="+", metavar="SCRIPT", help="run only these scripts (e.g. faults.py)")
    parser.add_argument("--output-dir", type=Path, default=HERE, help="where RESULTS.md, results.png and "
                        "results.jsonl go (default: benchmarks/)")
    parser.add_argument("--from-results", type=Path, metavar="JSONL", help="write the report from this results "
                        "file without running anything")
    args = parser.parse_args()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(HERE))
    from _results import ENV, record

    if args.from_results:
        records = load(args.from_results)
        meta = next((r for r in records if r["section"] == "_meta"), {})
        quick = bool(meta.get("quick"))
    else:
        quick = args.quick
        chosen = [b for b in BENCHMARKS if not args.only or b[0] in args.only]
        unknown = set(args.only or ()) - {b[0] for b in BENCHMARKS}
        if unknown:
            parser.error(f"unknown scripts: {', '.join(sorted(unknown))}")
        handle, path = tempfile.mkstemp(prefix="hasten-bench-", suffix=".jsonl")
        os.close(handle)
        os.environ[ENV] = path
        info = machine()
        peers = {p: importlib.util.find_spec(module) is not None for p, module in PEERS.items()}
        skipped = {b[0]: f"{b[3]} is not installed" for b in chosen if b[3] and importlib.util.find_spec(b[3]) is None}
        interpreter = sys.executable
        command = f"{interpreter} benchmarks/run_all.py" + "".join(f" {a}" for a in sys.argv[1:])
        record("_meta", "run", **info, peers=peers, quick=quick, command=command, skipped=skipped,
               only=args.only)
        print(f"hasten benchmarks{' (quick)' if quick else ''}: {len(chosen) - len(skipped)} scripts; peers: "
              + ", ".join(f"{p} {'installed' if ok else 'NOT installed'}" for p, ok in peers.items())
              + f"; results -> {path}", flush=True)
        started = time.monotonic()
        runnable = [b for b in chosen if b[0] not in skipped]
        for index, (script, full_limit, quick_limit, _) in enumerate(runnable, 1):
            script_args = ["--quick"] if quick else []
            code, seconds, output = run_script(script, script_args, quick_limit if quick else full_limit, index,
                                               len(runnable))
            output, repeats = once(output)  # DeepSpeed's runs repeat one FutureWarning thousands of times
            record("_run", script, args=script_args, exit=code, seconds=seconds, output=output,
                   repeated_warning_lines_dropped=repeats)
        for script, why in skipped.items():
            print(f"(skipped {script}: {why})", flush=True)
        print(f"\nall scripts done in {(time.monotonic() - started) / 60:.1f} min", flush=True)
        records = load(Path(path))
        previous = args.output_dir / "results.jsonl"
        if args.only and previous.exists():  # the scripts not run keep their figures from the last run
            records = merge(records, load(previous), {b[0] for b in runnable})
            with open(path, "w") as out:
                out.writelines(json.dumps(r) + "\n" for r in records)
        shutil.copyfile(path, args.output_dir / "results.jsonl")
        os.unlink(path)
    (args.output_dir / "RESULTS.md").write_text(render(records, quick))
    chart(records, args.output_dir / "results.png", quick)
    print(f"wrote {args.output_dir / 'RESULTS.md'} and {args.output_dir / 'results.png'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
