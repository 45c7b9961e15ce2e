"""Accelerate's own test suite, unchanged, passes under hasten's accelerate switch (`scripts/peer_suite.py`).

The suites are not part of this repository: they are read from `../shared/accelerate-1.16-tests` (the test
files of the Accelerate 1.16.0 source distribution, with the outcome of every test under Accelerate 1.16.0
itself on this machine kind) and, for the engine folders 1.16's archive lacks, `../shared/accelerate-1.15-tests`.
Every test that passes there must pass here, except those listed, each with its reason and the page that
documents the difference, in `tests/peer_suite_expected.yaml`; that list may only shrink (a listed test that
passes fails this test until it is taken out). Every file of the suites must import.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import peer_suite  # noqa: E402  (scripts/peer_suite.py)

SUITES = peer_suite.suites()
SUITE = SUITES[0]
REPORT_ENV = "HASTEN_PEER_SUITE_REPORT"  # set by scripts/test.sh: the JSON report of the run it started


def test_the_comparison_names_failures_stale_entries_and_files_that_do_not_import():
    baseline = {"tests/a.py::T::ok": "passed", "tests/a.py::T::broken": "passed", "tests/a.py::T::listed": "passed",
                "tests/a.py::T::fixed": "passed", "tests/a.py::T::gpu": "skipped", "tests/b.py::t": "passed"}
    run_a = peer_suite.FileRun("tests/a.py", {"tests/a.py::T::ok": "passed", "tests/a.py::T::broken": "failed",
                                              "tests/a.py::T::listed": "failed", "tests/a.py::T::fixed": "passed"})
    run_b = peer_suite.FileRun("tests/b.py", {"tests/b.py": "collect-error"})
    expected = {"tests/a.py::T::listed": {"reason": "r", "doc": "d"}, "tests/a.py::T::fixed": {"reason": "r", "doc": "d"}}
    report = peer_suite.compare([run_a, run_b], baseline, expected)
    assert report.table == [("tests/a.py", 2, 4), ("tests/b.py", 0, 1)]
    assert report.unexpected == [("tests/a.py::T::broken", "failed"), ("tests/b.py::t", "not run")]
    assert report.now_passing == ["tests/a.py::T::fixed"]
    assert report.not_importing == ["tests/b.py"]
    assert (report.passed, report.reference) == (2, 5)


def test_the_suites_are_116s_top_level_files_and_115s_engine_folders():
    if not all(suite.baseline_path.exists() for suite in SUITES) or len(SUITES) < 2:
        pytest.skip("the shared suites are not here (they are not part of this repository).")
    main, engines = SUITES
    assert (main.version, engines.version) == ("1.16.0", "1.15.0")
    assert "tests/test_accelerator.py" in main.files() and not any("/fsdp/" in f for f in main.files())
    assert {f.split("/")[1] for f in engines.files()} == {"fsdp", "deepspeed", "tp"}
    baseline = peer_suite.read_baselines(SUITES)
    assert sum(outcome == "passed" for node, outcome in baseline.items() if node.count("/") == 1) == 354
    assert not any(node.startswith("tests/test_") for node in peer_suite.read_baseline(engines))


def test_every_expected_difference_says_why_and_where_it_is_documented():
    entries = peer_suite.read_expected()
    docs = ROOT / "docs" / "coming-from-accelerate.md"
    headings = {line.lstrip("#").strip().lower() for line in docs.read_text().splitlines() if line.startswith("#")}
    for node, entry in entries.items():
        assert "::" in node, f"{node}: name a test by its pytest node id"
        if "doc" in entry:
            page, _, section = entry["doc"].partition("#")
            assert page == "docs/coming-from-accelerate.md", f"{node}: documented in docs/coming-from-accelerate.md"
            assert section.replace("-", " ") in {h.replace("-", " ") for h in headings}, \
                f"{node}: no section '{section}' in {page}"


def _runs_from_the_test_command(path: Path, limit: float = 1500) -> list[peer_suite.FileRun] | str:
    """The runs of the suite that `scripts/test.sh` made before pytest (its report; waited for if still coming)."""
    deadline = time.monotonic() + limit
    while not path.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"the suite started by scripts/test.sh wrote no report to {path} within {limit:.0f} s "
                        f"(its output: {path.with_suffix('.log')}).", pytrace=False)
        time.sleep(1)
    return peer_suite.read_report(path)


@pytest.mark.multiprocess
@pytest.mark.timeout(1800)
def test_accelerates_own_suite_passes_under_the_switch(capsys):
    # scripts/test.sh runs the suite before pytest, on its own, and names its report here; run without it,
    # this test runs the suite itself, two files at a time.
    made = os.environ.get(REPORT_ENV)
    if made:
        runs = _runs_from_the_test_command(Path(made))
        if isinstance(runs, str):
            pytest.skip(runs)
    else:
        if not SUITE.baseline_path.exists():
            pytest.skip(f"Accelerate's test suite is not at {SUITE.root} (it is not part of this repository).")
        if importlib.util.find_spec("accelerate") is None:
            pytest.skip("the suite's test helpers come from the accelerate 1.16.0 wheel (hasten's test extra).")
        runs = peer_suite.run_suite(SUITES, jobs=2, progress=False)
    expected = peer_suite.read_expected()
    report = peer_suite.compare(runs, peer_suite.read_baselines(SUITES), expected)
    with capsys.disabled():
        peer_suite.print_report(report, runs, expected)
    problems = ([f"does not import: {p}" for p in report.not_importing]
                + [f"{outcome} under hasten, passes under Accelerate: {node}" for node, outcome in report.unexpected]
                + [f"passes now, take it out of {peer_suite.EXPECTED.name}: {node}" for node in report.now_passing])
    if problems:
        outputs = {node.split("::")[0] for node, _ in report.unexpected} | set(report.not_importing)
        tails = "\n".join(f"--- {run.path} (exit {run.returncode}) ---\n{run.tail[-3000:]}"
                          for run in runs if run.path in outputs)
        pytest.fail("\n".join(problems) + "\n\n" + tails, pytrace=False)


def test_a_failure_that_passes_alone_is_counted_and_named(tmp_path):
    """A test of the suite that measures the whole machine can fail beside other work: it is run once more, alone."""
    if not SUITE.baseline_path.exists():
        pytest.skip(f"Accelerate's test suite is not at {SUITE.root} (it is not part of this repository).")
    nodes = {"tests/test_logging.py::test_log_stack"}
    run = peer_suite.FileRun("tests/test_logging.py", outcomes={"tests/test_logging.py::test_log_stack": "failed"})
    peer_suite._rerun_failures(peer_suite.prepare_rootdir(SUITE.root, tmp_path), run, "hasten", nodes, progress=False)
    assert run.outcomes == {"tests/test_logging.py::test_log_stack": "passed"}
    assert run.passed_on_rerun == ["tests/test_logging.py::test_log_stack"]
