"""examples/cv_example.py, the README's demo: with its defaults it reaches the accuracy it promises on 1 and 2 processes.

The two commands of examples/README.md, unchanged (16 epochs; a few seconds of training each on 2 CPU cores).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from conftest import launch, run_with_timeout

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cv_example.py"
# The script's own floor (MIN_ACCURACY: below it the script exits 1); measured here with the defaults:
# 0.9889 on 1 process, 0.9778 on 2 (examples/README.md: "about 0.98-0.99").
PROMISED = 0.95
FINAL = re.compile(r"^final validation accuracy: ([01]\.\d{4}) \((\d+) samples\)", flags=re.MULTILINE)


def _final(stdout: str) -> tuple[float, int]:
    found = FINAL.findall(stdout)
    assert len(found) == 1, f"expected one final line:\n{stdout[-2000:]}"
    accuracy, samples = found[0]
    return float(accuracy), int(samples)


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
@pytest.mark.parametrize("num_processes", [1, 2])
def test_cv_example_reaches_its_promised_accuracy(num_processes, tmp_path):
    logging_dir = ("--logging_dir", str(tmp_path / "runs"))  # not runs/ of the working directory
    if num_processes == 1:  # `python examples/cv_example.py`
        result = run_with_timeout([sys.executable, str(EXAMPLE), *logging_dir], 180,
                                  {**os.environ, "PYTHONUNBUFFERED": "1"})
        assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    else:  # `hasten launch --num_processes 2 examples/cv_example.py`
        result = launch(EXAMPLE, *logging_dir, num_processes=2, timeout=180)
    accuracy, samples = _final(result.stdout)
    assert samples == 360  # gather_for_metrics counts every validation image once, on any number of processes
    assert accuracy >= PROMISED, f"{num_processes} process(es): final validation accuracy {accuracy:.4f}"
