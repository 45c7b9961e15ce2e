"""Shared helpers: run a script through the real `hasten launch`, with a hard timeout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"

# The fp16 code paths (autocast, GradScaler, skipped steps) are tested on this GPU-less machine through hasten's
# opt-in CPU fp16; by default fp16 on the CPU trains in full precision, as under Accelerate (tests/parity unsets it).
os.environ.setdefault("HASTEN_CPU_FP16", "1")


def launch(script: str | Path, *script_args: str, num_processes: int = 2, launch_args: tuple[str, ...] = (),
           timeout: float = 120, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Start `script` through `python -m hasten launch` and wait at most `timeout` seconds.

    A hang fails the test quickly instead of eating the CI budget; a
    non-zero exit fails it with both output streams shown.
    """
    script = Path(script)
    if not script.is_absolute():
        script = SCRIPTS / script
    command = [sys.executable, "-m", "hasten", "launch", "--num_processes", str(num_processes), *launch_args,
               str(script), *script_args]
    run_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    result = run_with_timeout(command, timeout, run_env)
    if check and result.returncode != 0:
        pytest.fail(f"hasten launch exited {result.returncode}: {' '.join(command)}\n"
                    f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}")
    return result


@pytest.fixture(autouse=True)
def _fresh_gradient_state():
    """Every test starts with a fresh GradientState, as Accelerate's test cases do (`AccelerateTestCase`).

    The state is shared by every Accelerator of a process, as in Accelerate: a test that stops inside an
    accumulation cycle (sync_gradients False) would otherwise make the next test's optimizer skip its steps.
    """
    yield
    from hasten.runtime.gradient_state import GradientState

    GradientState._reset_state()


@pytest.fixture
def no_fp8_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make torchao and Transformer Engine look absent in this process (the test extra installs torchao)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name.split(".")[0] in
                        ("torchao", "transformer_engine") else real(name, *args))


def run_with_timeout(command: list[str], timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `command` in its own session; on timeout kill the whole session (no orphaned ranks) and fail."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"timed out after {timeout}s: {' '.join(command)}\nstdout:\n{stdout}\nstderr:\n{stderr}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def launch_ranks(script: str | Path, out: Path, num_processes: int = 2) -> dict[int, dict]:
    """Launch a script that writes `rank{N}.json` into `out`; return the results, checking every rank wrote one."""
    launch(script, str(out), num_processes=num_processes)
    results = results_by_rank(out)
    assert sorted(results) == list(range(num_processes)), f"ranks that reported: {sorted(results)}"
    return results


def results_by_rank(directory: Path) -> dict[int, dict]:
    """Read the `rank{N}.json` files a test script wrote into `directory`."""
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in sorted(directory.glob("rank*.json"))}


@pytest.fixture
def run_launch():
    return launch
