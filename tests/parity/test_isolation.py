"""Accelerate is a test dependency only: hasten must run without ever importing it, even where it is installed."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from .rewrite import rewrite_imports

pytestmark = pytest.mark.parity


def test_hasten_never_imports_accelerate() -> None:
    """`import hasten; from hasten import Accelerator` (and creating one) leaves accelerate out of sys.modules."""
    code = ("import sys, importlib.util\n"
            "assert importlib.util.find_spec('accelerate') is not None, 'accelerate must be installed for this test'\n"
            "import hasten\nfrom hasten import Accelerator\n"
            "import hasten.utils, hasten.state, hasten.data_loader\n"
            "Accelerator(cpu=True)\n"
            "print(sorted(m for m in sys.modules if m == 'accelerate' or m.startswith('accelerate.')))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]", f"hasten imported accelerate: {result.stdout}"


# Clients of the accelerate switch: a library built on Accelerate imports it, the script itself never does.
SWITCH_CLIENTS = {"trainer_client.py", "diffusers_loading_client.py", "sft_client.py", "peft_client.py", "tiny_lm.py"}


def test_rewritten_scripts_import_no_accelerate() -> None:
    """Every parity script imports accelerate, and rewritten it imports only hasten in its place."""
    scripts = sorted((Path(__file__).parent / "scripts").glob("*.py"))
    assert scripts
    for script in scripts:
        if script.name in SWITCH_CLIENTS:
            assert not [m for m in _imported(script.read_text()) if m.split(".")[0] == "accelerate"], script.name
            continue
        before, after = (_imported(text) for text in (script.read_text(), rewrite_imports(script.read_text())))
        assert any(m.split(".")[0] == "accelerate" for m in before), f"{script.name} does not use accelerate"
        assert not [m for m in after if m.split(".")[0] == "accelerate"], f"{script.name} rewritten: {after}"
        assert any(m.split(".")[0] == "hasten" for m in after)


def _imported(source: str) -> list[str]:
    modules = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.append(node.module)
    return modules
