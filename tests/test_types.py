"""`mypy src/hasten` reports no error: the type hints on public functions are checked, not decoration.

The configuration (which untyped optional engines are allowed to be unknown) is pyproject.toml's
[tool.mypy]; a blanket ignore would make this test pass while checking nothing, so there is none.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(600)
def test_mypy_reports_no_error():
    pytest.importorskip("mypy", reason="mypy is a test dependency: pip install -e '.[test]'")
    # mypy's own incremental cache, kept between runs outside the checkout (it re-checks any file whose content
    # changed): most of a cold run is reading torch's annotations, ~60 s of the suite on 2 cores
    cache = Path.home() / ".cache" / "hasten-mypy" / f"py{sys.version_info[0]}{sys.version_info[1]}"
    result = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache)],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, f"mypy src/hasten found errors:\n{result.stdout}{result.stderr}"
    assert "no issues found" in result.stdout


def test_mypy_config_has_no_blanket_ignore():
    text = (ROOT / "pyproject.toml").read_text()
    config = text.split("[tool.mypy]", 1)[1]
    assert "ignore_errors" not in config
    assert "ignore_missing_imports = true" not in config.split("[[tool.mypy.overrides]]", 1)[0]
