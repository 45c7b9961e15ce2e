"""A fast subset of Accelerate's own test scripts passes under hasten (scripts/peer_subtests.py --fast).

The scripts are read from the installed `accelerate` package (a test-only
dependency, never imported by hasten), their imports rewritten to hasten,
and each script's chosen sub-tests run in one launch on 1 and 2 processes.
The full comparison against Accelerate itself is the script without --fast.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from conftest import run_with_timeout

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "peer_subtests.py"


def _peer_python() -> str | None:
    """A Python that has accelerate: $PEER_PYTHON, this one, or the machine's peer venv."""
    if os.environ.get("PEER_PYTHON"):
        return os.environ["PEER_PYTHON"]
    if importlib.util.find_spec("accelerate") is not None:
        return sys.executable
    fallback = Path("/tmp/peer/bin/python")
    return str(fallback) if fallback.exists() else None


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_fast_subset_of_accelerates_own_tests_passes_under_hasten():
    peer = _peer_python()
    if peer is None:
        pytest.skip("accelerate is not installed (pip install accelerate==1.16.0, or set PEER_PYTHON)")
    result = run_with_timeout([sys.executable, str(SCRIPT), "--fast", "--peer-python", peer, "--processes", "1", "2"],
                              timeout=240)
    lines = [line for line in result.stdout.splitlines() if " sub-test(s) " in line]
    assert len(lines) == 6, result.stdout + result.stderr  # 3 scripts x 2 process counts
    assert result.returncode == 0 and all(" pass in " in line for line in lines), result.stdout + result.stderr
