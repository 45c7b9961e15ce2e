"""Accelerate's own test suite, unchanged, run against hasten through the accelerate switch.

The suites live outside this repository: `../shared/accelerate-1.16-tests` (the top-level test files of the
Accelerate 1.16.0 source distribution, the specification) and, for the engine folders 1.16's archive does not
ship (`fsdp/`, `deepspeed/`, `tp/`), `../shared/accelerate-1.15-tests`; each with the `conftest.py` that turns
the switch on and the outcome of every test under that Accelerate release on this machine kind. This script
runs them as their READMEs say: a copy of each folder as rootdir, one pytest process per test file (a process
group left by one file breaks the next under Accelerate too), Accelerate's own test helpers
(`accelerate.test_utils`) served from the wheel of the suite's release (the installed `accelerate==1.16.0`;
1.15.0's, downloaded once with pip into ~/.cache/hasten, for the engine folders), the environment offline
with one thread per process.

Every test that passes under Accelerate must pass under hasten, unless it is listed, with its
reason, in `tests/peer_suite_expected.yaml`. The table printed at the end gives, per file, the
tests that pass under hasten out of those that pass under Accelerate. The exit status is 1 when a
test fails that should pass, and also when a listed test passes (the list may only shrink: take
it out).

Example:
    $ python3 scripts/peer_suite.py                       # every file, two at a time
    $ python3 scripts/peer_suite.py tests/test_utils.py   # one file of the suite
    $ python3 scripts/peer_suite.py --lib accelerate      # the reference run, under Accelerate 1.16 itself
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
EXPECTED = ROOT / "tests" / "peer_suite_expected.yaml"
PLUGIN_DIR = Path(__file__).resolve().parent / "peer_suite_plugin"
HELPERS_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hasten" / "accelerate-test-helpers"
# TPU, SageMaker, bitsandbytes on a GPU and the examples (which need the Hub): not run, as the suites' READMEs say
LEFT_OUT = {"test_tpu.py", "test_sagemaker.py", "test_quantization.py", "test_examples.py", "xla_spawn.py"}
FILE_TIMEOUT = 900  # seconds for one file's pytest process, killed with its whole process group after


@dataclass(frozen=True)
class Suite:
    """One shared suite folder: the Accelerate release it specifies, and which of its test folders are run.

    `plugins`: pytest plugins (in `peer_suite_plugin/`) its runs load besides the outcome recorder.
    """

    root: Path
    version: str
    folders: tuple[str, ...]  # "" for the top-level test files
    plugins: tuple[str, ...] = ()

    @property
    def baseline_path(self) -> Path:
        return self.root / f"baseline-accelerate-{self.version}.txt"

    def files(self) -> list[str]:
        """The suite's test files (relative to its root) in the folders it is run for, in a stable order."""
        tests = self.root / "tests"
        found = [p for folder in self.folders for p in (tests / folder).glob("*.py")]
        return sorted(str(p.relative_to(self.root)) for p in found
                      if p.name not in LEFT_OUT and p.name != "__init__.py" and p.name.startswith("test_"))


# The specification (Accelerate 1.16's top-level tests), and 1.15's engine folders, which 1.16's archive lacks; their
# 1.15 test helpers import one name 1.16 removed, which `peer_legacy_helpers` supplies to those runs only.
DEFAULT_SUITE = SHARED / "accelerate-1.16-tests"
ENGINE_SUITE = SHARED / "accelerate-1.15-tests"


def suites(main: Path = DEFAULT_SUITE, engines: Path | None = ENGINE_SUITE) -> list[Suite]:
    """The suites a run covers: `main` (1.16's top-level files), and `engines` (1.15's engine folders) if present."""
    found = [Suite(main, "1.16.0", ("",))]
    if engines is not None and (engines / "baseline-accelerate-1.15.0.txt").exists():
        found.append(Suite(engines, "1.15.0", ("fsdp", "deepspeed", "tp"), plugins=("peer_legacy_helpers",)))
    return found


@dataclass
class FileRun:
    """One test file's pytest process: each test's outcome, and how the process ended."""

    path: str
    outcomes: dict[str, str] = field(default_factory=dict)
    returncode: int = 0
    seconds: float = 0.0
    tail: str = ""
    passed_on_rerun: list[str] = field(default_factory=list)  # failed beside other work, passed run again alone
    suite: str = ""  # the suite folder it belongs to


def read_baseline(suite: Suite) -> dict[str, str]:
    """Each test's outcome under the suite's Accelerate release (`passed`, `failed`, `skipped`), by pytest node id,
    for the files of the folders the suite is run for."""
    outcomes = {}
    wanted = set(suite.files())
    for line in suite.baseline_path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            outcome, node = line.split(None, 1)
            if node.split("::")[0] in wanted:
                outcomes[node.strip()] = outcome
    return outcomes


def read_baselines(runs: list[Suite]) -> dict[str, str]:
    """`read_baseline` of every suite, together (their files' paths differ)."""
    return {node: outcome for suite in runs for node, outcome in read_baseline(suite).items()}


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


def test_helpers(version: str) -> str:
    """The folder holding `test_utils/` of the accelerate `version` wheel (what the suite's conftest serves).

    The installed accelerate when it is that release; otherwise the wheel's copy kept in `HELPERS_CACHE`,
    fetched once with pip (`pip download accelerate==VERSION --no-deps`).
    """
    spec = importlib.util.find_spec("accelerate")
    try:
        installed = importlib.metadata.version("accelerate")
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if spec is not None and spec.submodule_search_locations and installed == version:
        return list(spec.submodule_search_locations)[0]
    target = HELPERS_CACHE / version / "accelerate"
    if not (target / "test_utils" / "__init__.py").exists():
        _fetch_helpers(version, target)
    return str(target)


def _fetch_helpers(version: str, target: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="accelerate-wheel-") as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                               "-d", tmp, f"accelerate=={version}"], capture_output=True, text=True)
        wheels = list(Path(tmp).glob("accelerate-*.whl"))
        if done.returncode != 0 or not wheels:
            raise SystemExit(f"the suite's test helpers come from the accelerate {version} wheel, which pip could not "
                             f"download ({done.stderr.strip()[-300:]}); install accelerate=={version} or put its "
                             f"accelerate/test_utils folder under {target}")
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        with zipfile.ZipFile(wheels[0]) as wheel:
            for name in wheel.namelist():
                if name.startswith("accelerate/test_utils/"):
                    wheel.extract(name, partial.parent / "unpacked")
        shutil.move(str(partial.parent / "unpacked" / "accelerate"), str(target))
        shutil.rmtree(partial.parent / "unpacked", ignore_errors=True)


def run_file(rootdir: Path, relpath: str, lib: str, timeout: float = FILE_TIMEOUT, collect_only: bool = False,
             helpers: str | None = None, plugins: tuple[str, ...] = ()) -> FileRun:
    """Run one file of the suite in its own pytest process (and process group); read each test's outcome.

    `helpers`: the folder holding the `test_utils/` to serve (default: the installed accelerate's);
    `plugins`: more pytest plugins of `peer_suite_plugin/` to load.

    `relpath` may name several files (space-separated) with `collect_only`: they are only imported and collected,
    together, in one process (no test runs, so no process group is left behind for the next file).
    """
    record = Path(tempfile.mkstemp(prefix="peer-outcomes-", suffix=".jsonl")[1])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "PEER_LIB": lib, "REAL_TEST_UTILS": helpers or test_helpers("1.16.0"),
           "PEER_SUITE_RECORD": str(record),
           # A ClearML task parses every Python file of the git repository holding the code that called
           # Task.init under `python -m pytest` (the library's tracking module), and diffs it: where Python lives
           # in a git checkout (pyenv), or the library is this checkout (editable), that takes minutes per task.
           # Git is told not to look above the interpreter's folder, nor into this checkout.
           "GIT_CEILING_DIRECTORIES": os.pathsep.join([str(Path(sys.base_prefix).parent), str(ROOT)]),
           "CLEARML_CONFIG_FILE": str(PLUGIN_DIR / "clearml.conf"),  # why: in that file
           "PYTHONPATH": os.pathsep.join(p for p in [str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")] if p),
           # the `accelerate` console scripts of this Python's environment (a virtualenv's need not be on PATH)
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    for name in ("HASTEN_CPU_FP16", "HASTEN_AS_ACCELERATE"):  # the project's own test settings are not the suite's
        env.pop(name, None)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "peer_outcomes",
               *(arg for plugin in plugins for arg in ("-p", plugin)),
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
    suite_of = {path: run.suite for run in runs for path in run.path.split()}
    for suite in sorted({run.suite for run in runs}):
        rows = [(here, reference) for path, here, reference in report.table if suite_of.get(path) == suite]
        files = sum(1 for path in suite_of if suite_of[path] == suite)
        print(f"{Path(suite).name + f' ({files} files)':<58} "
              f"{f'{sum(r[0] for r in rows)}/{sum(r[1] for r in rows)}':>16}")
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


def run_suite(runs_of: list[Suite], files: list[str] | None = None, lib: str = "hasten", jobs: int = 2,
              progress: bool = True) -> list[FileRun]:
    """Run `files` (default: every file) of the suites, `jobs` pytest processes at a time, the longest first.

    A file none of whose tests passes under Accelerate here (GPU-only files, say) has nothing to compare but
    whether it imports: a suite's such files are collected together in one process instead of each starting its own.
    """
    with tempfile.TemporaryDirectory(prefix="peer-suite-") as tmp:
        jobs_of: list[tuple[Suite, Path, str, bool]] = []
        contexts: dict[Path, tuple[Path, str, set[str]]] = {}
        for number, suite in enumerate(runs_of):
            chosen = [f for f in suite.files() if files is None or f in files]
            if not chosen:
                continue
            reference_passes = {node for node, outcome in read_baseline(suite).items() if outcome == "passed"}
            reference = {node.split("::")[0] for node in reference_passes}
            rootdir = prepare_rootdir(suite.root, Path(tmp) / str(number))
            contexts[suite.root] = (rootdir, test_helpers(suite.version), reference_passes)
            jobs_of += [(suite, rootdir, f, False) for f in sorted((f for f in chosen if f in reference),
                                                                   key=lambda f: -(suite.root / f).stat().st_size)]
            import_only = " ".join(f for f in chosen if f not in reference)
            if import_only:
                jobs_of.append((suite, rootdir, import_only, True))
        runs: list[FileRun] = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(run_file, rootdir, f, lib, collect_only=collect,
                                   helpers=contexts[suite.root][1], plugins=suite.plugins): suite
                       for suite, rootdir, f, collect in jobs_of}
            for future in concurrent.futures.as_completed(futures):
                run = future.result()
                run.suite = str(futures[future].root)
                runs.append(run)
                if progress:
                    done = sum(1 for o in run.outcomes.values() if o == "passed")
                    print(f"[{len(runs)}/{len(jobs_of)}] {run.path}: {done} passed, exit {run.returncode}, "
                          f"{run.seconds:.0f} s", flush=True)
        for run in runs:
            suite = next(s for s in runs_of if str(s.root) == run.suite)
            rootdir, helpers, reference_passes = contexts[suite.root]
            _rerun_failures(rootdir, run, lib, reference_passes, progress, helpers=helpers, plugins=suite.plugins)
    return sorted(runs, key=lambda r: r.path)


def _rerun_failures(rootdir: Path, run: FileRun, lib: str, reference_passes: set[str], progress: bool,
                    helpers: str | None = None, plugins: tuple[str, ...] = ()) -> None:
    """Run once more, alone, the tests of `run` that pass under Accelerate but failed here.

    Some of Accelerate's tests measure the whole machine (`test_free_memory_dereferences_prepared_components`
    compares the system's available RAM before and after, within 50 MB), so they fail when other work frees
    memory meanwhile, as it does beside the project's own tests; such a test that passes alone is counted as
    passed, and the report names it. A test that fails again stays failed.
    """
    failed = [node for node, outcome in run.outcomes.items() if node in reference_passes and outcome != "passed"]
    if not failed or any(outcome == "collect-error" for outcome in run.outcomes.values()):
        return
    again = run_file(rootdir, " ".join(failed), lib, helpers=helpers, plugins=plugins)
    for node in failed:
        if again.outcomes.get(node) == "passed":
            run.outcomes[node] = "passed"
            run.passed_on_rerun.append(node)
    if progress and run.passed_on_rerun:
        print(f"passed on a rerun alone: {', '.join(run.passed_on_rerun)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="test files of the suites (default: all of them)")
    parser.add_argument("--suite", type=Path, default=DEFAULT_SUITE,
                        help="the Accelerate 1.16 suite folder (default: %(default)s)")
    parser.add_argument("--engine-suite", type=Path, default=ENGINE_SUITE,
                        help="the Accelerate 1.15 suite folder whose engine folders are run (default: %(default)s)")
    parser.add_argument("--lib", choices=["hasten", "accelerate"], default="hasten",
                        help="accelerate: the reference run of the 1.16 suite, under the installed Accelerate itself")
    parser.add_argument("--jobs", type=int, default=2, help="pytest processes at a time (default: 2)")
    parser.add_argument("--show-failures", action="store_true", help="print the output of files with failures")
    parser.add_argument("--report", type=Path, help="also write every file's run as JSON here (tests/test_peer_suite.py "
                                                    "reads it when scripts/test.sh ran the suite beside pytest)")
    args = parser.parse_args(argv)
    chosen = suites(args.suite, args.engine_suite if args.lib == "hasten" else None)
    if not chosen[0].baseline_path.exists():
        message = f"no Accelerate test suite at {args.suite} (it is not part of this repository); pass --suite"
        if args.report:
            write_report(args.report, {"absent": message})
        print(message)
        return 2
    runs = run_suite(chosen, args.files or None, args.lib, args.jobs)
    if args.report:
        write_report(args.report, {"suites": [str(s.root) for s in chosen],
                                   "runs": [dataclasses.asdict(run) for run in runs]})
    expected = read_expected() if args.lib == "hasten" else {}
    report = compare(runs, read_baselines(chosen), expected)
    if args.show_failures:
        bad = {node.split("::")[0] for node, _ in report.unexpected}
        for run in runs:
            if run.path in bad:
                print(f"\n===== {run.path} (exit {run.returncode}) =====\n{run.tail}")
    print_report(report, runs, expected)
    return 1 if report.unexpected or report.now_passing or report.not_importing else 0


if __name__ == "__main__":
    sys.exit(main())
