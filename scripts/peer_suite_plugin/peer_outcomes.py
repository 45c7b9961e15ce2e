"""A pytest plugin for `scripts/peer_suite.py`: each test's outcome as one JSON line in `$PEER_SUITE_RECORD`.

A test passes when its call passed and neither its set-up nor its tear-down failed, as pytest counts it;
a skip in any phase is `skipped`.
"""

from __future__ import annotations

import json
import os

_outcomes: dict[str, str] = {}


def pytest_runtest_logreport(report) -> None:  # type: ignore[no-untyped-def]
    node = report.nodeid
    if report.outcome == "failed":
        _outcomes[node] = "failed"
    elif report.outcome == "skipped" and _outcomes.get(node) != "failed":
        _outcomes[node] = "skipped"
    elif report.when == "call" and _outcomes.get(node) not in ("failed", "skipped"):
        _outcomes[node] = "passed"


def pytest_collectreport(report) -> None:  # type: ignore[no-untyped-def]
    if report.failed:  # a test file that does not even import
        _outcomes[report.nodeid or "<collection>"] = "collect-error"


def pytest_sessionfinish(session) -> None:  # type: ignore[no-untyped-def]
    path = os.environ.get("PEER_SUITE_RECORD")
    if path:
        with open(path, "a") as record:
            for node, outcome in _outcomes.items():
                record.write(json.dumps({"node": node, "outcome": outcome}) + "\n")
