"""Accelerate 1.15's own test suite, unchanged, run against hasten through the accelerate switch.

The suite lives outside this repository (`../shared/accelerate-1.15-tests`: Accelerate's `tests/`
folder verbatim, its `conftest.py` that turns the switch on, and the outcome of every test under
Accelerate 1.15.0 itself on this machine kind). This script runs it as that folder's README says:
a copy of the folder as rootdir, one pytest process per test file (a process group left by one
file breaks the next under Accelerate too), Accelerate's own test helpers served from the
installed `accelerate==1.15.0` wheel, the environment offline with one thread per process.

Every test that passes under Accelerate must pass under hasten, unless it is listed, with its
reason, in `tests/peer_suite_expected.yaml`. The table printed at the end gives, per file, the
tests that pass under hasten out of those that pass under Accelerate. The exit status is 1 when a
test fails that should pass, and also when a listed test passes (the list may only shrink: take
it out).

Example:
    $ python3 scripts/peer_suite.py                       # every file, two at a time
    $ python3 scripts/peer_suite.py tests/test_utils.py   # one file of the suite
    $ python3 scripts/peer_suite.py --lib accelerate      # the reference run, under Accelerate itself
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SUITE = ROOT.parent / "shared" / "accelerate-1.15-tests"
EXPECTED = ROOT / "tests" / "peer_suite_expected.yaml"
BASELINE_NAME = "baseline-accelerate-1.15.0.txt"
PLUGIN_DIR = Path(__file__).resolve().parent / "peer_suite_plugin"
# TPU, SageMaker, bitsandbytes on a GPU and the examples (which need the Hub): not run, as the suite's README says
LEFT_OUT = {"test_tpu.py", "test_sagemaker.py", "test_quantization.py", "test_examples.py", "xla_spawn.py"}
FILE_TIMEOUT = 900  # seconds for one file's pytest process, killed with its whole process group after


@dataclass
class FileRun:
    """One test file's pytest process: each test's outcome, and how the process ended."""

    path: str
    outcomes: dict[str, str] = field(default_factory=dict)
    returncode: int = 0
    seconds: float = 0.0
    tail: str = ""
    passed_on_rerun: list[str] = field(default_factory=list)  # failed beside other work, passed run again alone


def read_baseline(suite: Path) -> dict[str, str]:
    """Each test's outcome under Accelerate 1.15.0 (`passed`, `failed`, `skipped`), by pytest node id."""
    outcomes = {}
    for line in (suite / BASELINE_NAME).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            outcome, node = line.split(None, 1)
            outcomes[node.strip()] = outcome
    return outcomes


def read_expected(path: Path = EXPECTED) -> dict[str, dict[str, str]]:
    """The tests allowed to fail under hasten, each with `reason` and `doc` (or `hardware`)."""
    import yaml

    if not path.exists():
        return {}
    entries = yaml.safe_load(path.read_text()) or {}
    for node, entry in entries.items():
        if not isinstance(entry, dict) or not entry.get("reason") or not (entry.get("doc") or entry.get("hardware")):
            raise SystemExit(f"{path.name}: {node} needs a `reason` and a `doc` page (or `hardware`)")
    return entries


def test_files(suite: Path) -> list[str]:
    """The suite's test files, relative to its root, in a stable order."""
    tests = suite / "tests"
    found = [*tests.glob("*.py"), *tests.glob("fsdp/*.py"), *tests.glob("deepspeed/*.py"), *tests.glob("tp/*.py")]
    return sorted(str(p.relative_to(suite)) for p in found
                  if p.name not in LEFT_OUT and p.name != "__init__.py" and p.name.startswith("test_"))


def accelerate_wheel_dir() -> str:
    """The installed real accelerate package (its `test_utils/` serves the suite's helpers), without importing it."""
    spec = importlib.util.find_spec("accelerate")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the suite's test helpers come from the accelerate 1.15.0 wheel: pip install 'accelerate==1.15.0' "
                         "(it is in hasten's test extra)")
    return list(spec.submodule_search_locations)[0]


def run_file(rootdir: Path, relpath: str, lib: str, timeout: float = FILE_TIMEOUT, collect_only: bool = False) -> FileRun:
    """Run one file of the suite in its own pytest process (and process group); read each test's outcome.

    `relpath` may name several files (space-separated) with `collect_only`: they are only imported and collected,
    together, in one process (no test runs, so no process group is left behind for the next file).
    """
    record = Path(tempfile.mkstemp(prefix="peer-outcomes-", suffix=".jsonl")[1])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "PEER_LIB": lib, "REAL_TEST_UTILS": accelerate_wheel_dir(),
           "PEER_SUITE_RECORD": str(record),
           # A ClearML task parses every Python file of the git repository holding the code that called
           # Task.init under `python -m pytest` (the library's tracking module), and diffs it: where Python lives
           # in a git checkout (pyenv), or the library is this checkout (editable), that takes minutes per task.
           # Git is told not to look above the interpreter's folder, nor into this checkout.
           "GIT_CEILING_DIRECTORIES": os.pathsep.join([str(Path(sys.base_prefix).parent), str(ROOT)]),
           "CLEARML_CONFIG_FILE": str(PLUGIN_DIR / "clearml.conf"),  # why: in that file
           "PYTHONPATH": os.pathsep.join(p for p in [str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")] if p)}
    for name in ("HASTEN_CPU_FP16", "HASTEN_AS_ACCELERATE"):  # the project's own test settings are not the suite's
        env.pop(name, None)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "peer_outcomes",
               "--timeout", "300", *(["--collect-only"] if collect_only else []), *relpath.split()]
    start = time.monotonic()
    # Output into a file, not a pipe: a process a test started in a session of its own (torch's elastic agent
    # starts ranks so) and left behind would hold a pipe open, and reading it to the end would never return.
    with tempfile.TemporaryFile("w+") as sink:
        process = subprocess.Popen(command, cwd=rootdir, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                   text=True, start_new_session=True)
        try:
            process.wait(timeout=timeout)
            suffix = ""
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            suffix = f"\n[peer_suite] killed after {timeout:.0f} s"
        finally:
            with _suppress():
                os.killpg(process.pid, signal.SIGKILL)  # anything the file left running in its group
        sink.seek(0)
        output = sink.read() + suffix
    run = FileRun(relpath, returncode=process.returncode, seconds=time.monotonic() - start, tail=output[-6000:])
    for line in record.read_text().splitlines():
        entry = json.loads(line)
        run.outcomes[entry["node"]] = entry["outcome"]
    record.unlink()
    return run


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


@dataclass
class Report:
    """The comparison of a run with the reference and the expected-differences list."""

    table: list[tuple[str, int, int]]
    unexpected: list[tuple[str, str]]   # (node, outcome here) for tests that pass under Accelerate
    not_importing: list[str]            # test files whose collection failed
    now_passing: list[str]              # listed as expected to fail, yet passed
    passed: int
    reference: int


def compare(runs: list[FileRun], baseline: dict[str, str], expected: dict[str, dict[str, str]]) -> Report:
    """Per file: passed here / passed under Accelerate; the failures not in the list; the list's stale entries."""
    outcomes = {node: outcome for run in runs for node, outcome in run.outcomes.items()}
    ran = {run.path for run in runs}
    table, unexpected, now_passing = [], [], []
    passed = reference = 0
    for path in sorted(ran):
        nodes = [n for n, o in baseline.items() if o == "passed" and n.split("::")[0] == path]
        here = [n for n in nodes if outcomes.get(n) == "passed"]
        if nodes:
            table.append((path, len(here), len(nodes)))
        passed, reference = passed + len(here), reference + len(nodes)
        for node in nodes:
            if outcomes.get(node) != "passed" and node not in expected:
                unexpected.append((node, outcomes.get(node, "not run")))
        now_passing += [n for n in expected if n.split("::")[0] == path and outcomes.get(n) == "passed"]
    not_importing = sorted({node.split("::")[0] for node, outcome in outcomes.items() if outcome == "collect-error"})
    return Report(table, unexpected, not_importing, now_passing, passed, reference)


def print_report(report: Report, runs: list[FileRun], expected: dict[str, dict[str, str]]) -> None:
    seconds = {run.path: run.seconds for run in runs}
    print(f"\n{'file':<58} {'passed/reference':>16} {'time':>7}")
    for path, here, reference in report.table:
        print(f"{path:<58} {f'{here}/{reference}':>16} {seconds[path]:6.0f}s")
    listed = sum(1 for n in expected if any(n.split('::')[0] == r.path for r in runs))
    print(f"{'all':<58} {f'{report.passed}/{report.reference}':>16}   ({listed} listed as expected differences)")
    for path in report.not_importing:
        print(f"DOES NOT IMPORT: {path}")
    for node, outcome in report.unexpected:
        print(f"UNEXPECTED {outcome}: {node}")
    for node in report.now_passing:
        print(f"NOW PASSING (take it out of {EXPECTED.name}): {node}")
    for node in (n for run in runs for n in run.passed_on_rerun):
        print(f"passed only on a rerun alone (it failed beside other work): {node}")


def write_report(path: Path, content: dict) -> None:
    """Write the runs as JSON, atomically: a reader waiting for the file never sees half of it."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(content))
    os.replace(partial, path)


def read_report(path: Path) -> list[FileRun] | str:
    """The runs a `--report` file holds, or the sentence saying why there were none."""
    content = json.loads(path.read_text())
    if "absent" in content:
        return str(content["absent"])
    return [FileRun(**run) for run in content["runs"]]


def prepare_rootdir(suite: Path, into: Path) -> Path:
    """A writable copy of the suite folder (tests write next to themselves; the shared folder is read-only)."""
    rootdir = into / "suite"
    shutil.copytree(suite, rootdir, ignore=shutil.ignore_patterns("__pycache__"))
    for path in rootdir.rglob("*"):
        path.chmod(path.stat().st_mode | 0o200)
    return rootdir


def run_suite(suite: Path, files: list[str], lib: str = "hasten", jobs: int = 2,
              progress: bool = True) -> list[FileRun]:
    """Run `files` of the suite, `jobs` pytest processes at a time, the longest first.

    A file none of whose tests passes under Accelerate here (GPU-only files, say) has nothing to compare but
    whether it imports: those files are collected together in one process instead of each starting its own.
    """
    reference_passes = {node for node, outcome in read_baseline(suite).items() if outcome == "passed"}
    reference = {node.split("::")[0] for node in reference_passes}
    order = sorted((f for f in files if f in reference), key=lambda f: -(suite / f).stat().st_size)
    import_only = " ".join(f for f in files if f not in reference)
    with tempfile.TemporaryDirectory(prefix="peer-suite-") as tmp:
        rootdir = prepare_rootdir(suite, Path(tmp))
        runs = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(run_file, rootdir, f, lib): f for f in order}
            if import_only:
                futures[pool.submit(run_file, rootdir, import_only, lib, collect_only=True)] = import_only
            for future in concurrent.futures.as_completed(futures):
                run = future.result()
                runs.append(run)
                if progress:
                    done = sum(1 for o in run.outcomes.values() if o == "passed")
                    print(f"[{len(runs)}/{len(order)}] {run.path}: {done} passed, exit {run.returncode}, "
                          f"{run.seconds:.0f} s", flush=True)
        for run in runs:
            _rerun_failures(rootdir, run, lib, reference_passes, progress)
    return sorted(runs, key=lambda r: r.path)


def _rerun_failures(rootdir: Path, run: FileRun, lib: str, reference_passes: set[str], progress: bool) -> None:
    """Run once more, alone, the tests of `run` that pass under Accelerate but failed here.

    Some of Accelerate's tests measure the whole machine (`test_free_memory_dereferences_prepared_components`
    compares the system's available RAM before and after, within 50 MB), so they fail when other work frees
    memory meanwhile, as it does beside the project's own tests; such a test that passes alone is counted as
    passed, and the report names it. A test that fails again stays failed.
    """
    failed = [node for node, outcome in run.outcomes.items() if node in reference_passes and outcome != "passed"]
    if not failed or any(outcome == "collect-error" for outcome in run.outcomes.values()):
        return
    again = run_file(rootdir, " ".join(failed), lib)
    for node in failed:
        if again.outcomes.get(node) == "passed":
            run.outcomes[node] = "passed"
            run.passed_on_rerun.append(node)
    if progress and run.passed_on_rerun:
        print(f"passed on a rerun alone: {', '.join(run.passed_on_rerun)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="test files of the suite (default: all of them)")
    parser.add_argument("--suite", type=Path, default=DEFAULT_SUITE, help="the suite folder (default: %(default)s)")
    parser.add_argument("--lib", choices=["hasten", "accelerate"], default="hasten")
    parser.add_argument("--jobs", type=int, default=2, help="pytest processes at a time (default: 2)")
    parser.add_argument("--show-failures", action="store_true", help="print the output of files with failures")
    parser.add_argument("--report", type=Path, help="also write every file's run as JSON here (tests/test_peer_suite.py "
                                                    "reads it when scripts/test.sh ran the suite beside pytest)")
    args = parser.parse_args(argv)
    if not (args.suite / BASELINE_NAME).exists():
        message = f"no Accelerate test suite at {args.suite} (it is not part of this repository); pass --suite"
        if args.report:
            write_report(args.report, {"absent": message})
        print(message)
        return 2
    files = args.files or test_files(args.suite)
    runs = run_suite(args.suite, files, args.lib, args.jobs)
    if args.report:
        write_report(args.report, {"suite": str(args.suite), "runs": [dataclasses.asdict(run) for run in runs]})
    expected = read_expected() if args.lib == "hasten" else {}
    report = compare(runs, read_baseline(args.suite), expected)
    if args.show_failures:
        bad = {node.split("::")[0] for node, _ in report.unexpected}
        for run in runs:
            if run.path in bad:
                print(f"\n===== {run.path} (exit {run.returncode}) =====\n{run.tail}")
    print_report(report, runs, expected)
    return 1 if report.unexpected or report.now_passing or report.not_importing else 0


if __name__ == "__main__":
    sys.exit(main())
