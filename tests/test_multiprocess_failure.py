"""A rank that raises: `hasten launch` stops the run promptly, exits non-zero and names the failing rank."""

from __future__ import annotations

import re
import time

import pytest

from conftest import launch

SCRIPT = "mp_rank_raises.py"


@pytest.mark.multiprocess
@pytest.mark.parametrize("healthy_rank_is", ["barrier", "busy"])
def test_rank_that_raises_fails_the_launch(tmp_path, healthy_rank_is):
    """Rank 1 raises ValueError("boom") while rank 0 waits at a barrier ("barrier") or computes ("busy")."""
    start = time.monotonic()
    result = launch(SCRIPT, str(tmp_path), healthy_rank_is, num_processes=2, timeout=120, check=False)
    elapsed = time.monotonic() - start
    output = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"

    assert result.returncode != 0, output
    # the launcher must stop rank 0, not wait for the 30 min group timeout (or the 90 s sleep)
    assert elapsed < 60, f"the failed run took {elapsed:.0f}s to end\n{output}"
    marker = "rank0_busy" if healthy_rank_is == "busy" else "rank0_reached_barrier"
    assert (tmp_path / marker).exists(), output
    assert not (tmp_path / "rank0_done").exists()
    assert not list(tmp_path.glob("rank1_*")), "rank 1 went on after raising"

    stderr = result.stderr
    # the failing rank's own traceback, with the user's frame and message
    assert "Traceback (most recent call last)" in stderr, output
    assert 'raise ValueError("boom")' in stderr, output
    assert "ValueError: boom" in stderr, output
    assert re.search(r"rank 1\b.*ValueError: boom", stderr), f"the traceback is not attributed to rank 1\n{output}"
    # the launcher's summary blames rank 1 (the root cause), not rank 0 (which was only stopped)
    summary = [line for line in stderr.splitlines() if line.startswith("hasten launch:")]
    assert summary, f"no summary line from the launcher\n{output}"
    assert re.search(r"\brank 1\b", summary[-1]) and not re.search(r"\brank 0\b", summary[-1]), (
        f"the launcher's summary names the wrong rank: {summary[-1]!r}\n{output}"
    )
    assert "boom" in summary[-1], output
