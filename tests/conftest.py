"""Shared helpers: run a script through the real `hasten launch`, with a hard timeout."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

SCRIPTS = Path(__file__).parent / "scripts"

# The longest files, first: the test command's two workers (pytest-xdist, --dist loadfile) take whole files in the
# order collected, and a long file taken last would leave one core idle while it runs, at the end of the suite.
LONGEST_FIRST = ("test_elastic.py", "test_doc_commands.py", "parity/test_trainer.py", "parity/test_clients.py",
                 "test_checkpoint_accelerate.py", "test_elastic_liveness.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def place(item: pytest.Item) -> int:
        path = item.nodeid.split("::")[0]
        return next((i for i, name in enumerate(LONGEST_FIRST) if path.endswith(name)), len(LONGEST_FIRST))

    items.sort(key=place)  # (stable: the other files, and the tests in a file, keep their order)

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
def _fresh_shared_state():
    """Every test starts with a fresh GradientState (and Accelerate's own states), as Accelerate's test cases do
    (`AccelerateTestCase`).

    The state is shared by every Accelerator of a process, as in Accelerate: a test that stops inside an
    accumulation cycle (sync_gradients False) would otherwise make the next test's optimizer skip its steps.
    """
    yield
    from hasten.runtime.gradient_state import GradientState
    from hasten.runtime.state import _partial_facts

    GradientState._reset_state()
    # what the test's Accelerator told PartialState (as Accelerate's, it outlives the Accelerator): a later test's
    # PartialState() would read a DeepSpeed run's type (prepare_data_loader on a mesh reads DeepSpeed's rule then)
    _partial_facts.pop("distributed_type", None)
    # Accelerate's own state too, where a differential test ran the real package in this process: its next
    # Accelerator (another test's, with another mixed_precision) would be refused as a change of a set-up state.
    peer = sys.modules.get("accelerate.state")
    if peer is not None and peer.__name__ == "accelerate.state":  # under the switch the name is hasten.state
        peer.AcceleratorState._reset_state(True)
        peer.GradientState._reset_state()


@pytest.fixture(autouse=True)
def _environment_kept():
    """Every test leaves os.environ as it found it.

    Code under test sets variables on purpose: Accelerate's enable_fsdp_ram_efficient_loading sets
    ACCELERATE_USE_FSDP (which Accelerator() reads, as Accelerate's does), and a one-process DeepSpeed engine
    sets RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT for its group of one. Left behind, they reach every later
    launch of the suite through its environment (an FSDP run, a port this process still holds).
    """
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(autouse=True)
def _no_process_group_left():
    """A test that made a process group in this process (a one-process DeepSpeed engine makes one) ends it: a later
    test's notebook_launcher refuses to fork from a process that belongs to a group, rightly."""
    import torch.distributed as dist

    had = dist.is_available() and dist.is_initialized()
    yield
    if not had and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def no_engine_variables():
    """The test starts without FSDP_* / ACCELERATE_* variables (`_environment_kept` puts them back) and the
    Accelerator's state is forgotten after it (the plugin tests compare fields the variables would fill)."""
    from hasten.state import AcceleratorState

    for name in [n for n in os.environ if n.startswith(("FSDP_", "ACCELERATE_"))]:
        del os.environ[name]
    yield
    AcceleratorState._reset_state()


@pytest.fixture
def no_fp8_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make torchao and Transformer Engine look absent in this process (the test extra installs torchao)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name.split(".")[0] in
                        ("torchao", "transformer_engine") else real(name, *args))


RUN_MARK_ENV = "HASTEN_TEST_RUN_MARK"  # set in each started command's environment; every process it starts inherits it
LEFTOVER_GRACE = 30.0  # seconds processes a finished command started may keep its output open before they are killed


def _kill_marked(mark: str) -> list[str]:
    """SIGKILL every process whose environment carries `mark` (those a command started, in any session); their names."""
    needle = f"{RUN_MARK_ENV}={mark}".encode()
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            name = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            os.kill(int(entry.name), signal.SIGKILL)
            killed.append(f"{entry.name} {name[:120]}")
        except (OSError, ValueError):  # gone meanwhile, or not ours to read
            continue
    return killed


def run_with_timeout(command: list[str], timeout: float, env: dict[str, str] | None = None,
                     leftovers_fail: bool = True, leftover_grace: float = LEFTOVER_GRACE,
                     finished: Callable[[], bool] | None = None) -> subprocess.CompletedProcess:
    """Run `command` in its own session; on timeout kill everything it started (no orphaned ranks) and fail.

    "Everything it started" is found by a mark in the environment, not by
    process group: a launcher may start its ranks in sessions of their own
    (torch's elastic agent does), and a rank left behind would keep the
    output pipes open, so that waiting for them never ends. When the command
    itself has exited but processes it started still hold its output after
    `leftover_grace` seconds, they are killed, and the test fails saying so
    unless `leftovers_fail` is False (a peer library's run, whose ranks may
    hang in torch's exit, is not what the test measures). `finished`, when
    given, says from the command's own output files that its work is done:
    once it holds, the command has `leftover_grace` seconds to exit before
    all it started is killed and what it printed is returned (its return
    code then that of the kill).
    """
    mark = f"{os.getpid()}-{time.monotonic_ns()}"
    run_env = {**(os.environ if env is None else env), RUN_MARK_ENV: mark}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=run_env,
                               start_new_session=True)
    deadline, exited_at, done_at = time.monotonic() + timeout, None, None
    while True:
        try:
            stdout, stderr = process.communicate(timeout=1.0)  # retrying loses no output (subprocess's promise)
            return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
        except subprocess.TimeoutExpired:
            now = time.monotonic()
            if finished is not None and process.poll() is None and (done_at is not None or finished()):
                done_at = done_at or now
                if now - done_at > leftover_grace:  # the work is done; the exit hangs
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    _kill_marked(mark)
                    stdout, stderr = process.communicate()
                    note = f"\n[run_with_timeout] killed {leftover_grace:.0f}s after its work was done: its exit hung"
                    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr + note)
            if process.poll() is not None:
                exited_at = exited_at or now
                if now - exited_at > leftover_grace:
                    killed = _kill_marked(mark)
                    stdout, stderr = process.communicate()
                    if leftovers_fail:
                        pytest.fail(f"{' '.join(command)} exited {process.returncode} but left processes running, "
                                    f"killed after {leftover_grace:.0f}s: {killed}\nstdout:\n{stdout}\nstderr:\n{stderr}")
                    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
            if now > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                _kill_marked(mark)
                stdout, stderr = process.communicate()
                pytest.fail(f"timed out after {timeout}s: {' '.join(command)}\nstdout:\n{stdout}\nstderr:\n{stderr}")


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
