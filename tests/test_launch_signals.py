"""Stopping `hasten launch`: Ctrl-C, SIGTERM or SIGKILL to the launcher ends the run and leaves no rank behind.

Each test starts `hasten launch --num_processes 2 mp_sleep_forever.py OUT TOKEN`
(the ranks create an Accelerator, prove the group works, then sleep),
waits until both ranks are up, signals ONLY the launcher's pid, and then
scans /proc for any process whose command line still holds TOKEN.
SIGINT/SIGTERM are handled by the launcher (which stops its ranks);
SIGKILL cannot be, so the ranks (torchrun mode) or mpirun (mpirun mode)
must die through PR_SET_PDEATHSIG.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import SCRIPTS
from test_multinode import clean_env

SCRIPT = SCRIPTS / "mp_sleep_forever.py"
START_TIMEOUT = 120  # the machine may be busy with other test runs
EXIT_WITHIN = 10  # seconds from the signal to the launcher's exit
GONE_WITHIN = 10  # seconds from the launcher's exit until no rank is left

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="scans /proc for leftover ranks")

MODES = {
    "torchrun": (),
    "mpirun": pytest.param(("--multi_cpu", "--mpirun"), marks=pytest.mark.skipif(
        shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")),
}


def processes_with(token: str) -> dict[int, str]:
    """pid -> command line of every live process whose command line contains `token` (zombies excluded)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone meanwhile
            continue
        if token.encode() in cmdline and state != "Z":
            found[int(entry)] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
    return found


def kill_all(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def started(tmp_path):
    """Start the launcher in a session of its own; yields a function (mode args) -> (process, token, out dir, log)."""
    runs: list[tuple[subprocess.Popen, str]] = []

    def start(mode_args: tuple[str, ...]) -> tuple[subprocess.Popen, str, Path, Path]:
        token = f"hasten-signal-test-{uuid.uuid4().hex}"
        out, log = tmp_path / "out", tmp_path / "launcher.log"
        command = [sys.executable, "-m", "hasten", "launch", "--num_processes", "2", *mode_args, str(SCRIPT),
                   str(out), token]
        with open(log, "w") as handle:
            process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=clean_env(),
                                       start_new_session=True)
        runs.append((process, token))
        deadline = time.monotonic() + START_TIMEOUT
        while len(list(out.glob("ready.rank*"))) < 2:
            if process.poll() is not None:
                pytest.fail(f"the launcher exited {process.returncode} before the ranks were up:\n{log.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"the ranks were not up after {START_TIMEOUT}s:\n{log.read_text()}")
            time.sleep(0.1)
        ranks = {int(p.read_text()) for p in out.glob("ready.rank*")}
        alive = processes_with(token)
        assert ranks <= set(alive), f"rank pids {ranks} not found by the /proc scan {alive}"  # the scan works
        return process, token, out, log

    yield start
    for process, token in runs:  # whatever happened: nothing of ours outlives the test
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        kill_all(processes_with(token))


def wait_gone(token: str, within: float) -> dict[int, str]:
    deadline = time.monotonic() + within
    while True:
        left = processes_with(token)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


@pytest.mark.multiprocess
@pytest.mark.parametrize("mode_args", MODES.values(), ids=MODES.keys())
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_signal_to_launcher_leaves_no_rank(started, mode_args, sig):
    process, token, out, log = started(mode_args)
    sent = time.monotonic()
    os.kill(process.pid, sig)  # the launcher only, not its process group
    try:
        code = process.wait(EXIT_WITHIN)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the launcher was still running {EXIT_WITHIN}s after {sig.name}:\n{log.read_text()}")
    exit_seconds = time.monotonic() - sent
    left = wait_gone(token, GONE_WITHIN)
    kill_all(left)
    output = log.read_text()
    assert not left, f"processes outlived the launcher ({sig.name}, exit {code}):\n" + "\n".join(
        f"  {pid}: {cmd}" for pid, cmd in left.items()) + f"\nlauncher output:\n{output}"
    assert not list(out.glob("finished.rank*")), "a rank ran to the end of its sleep"
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
    else:
        # like a shell: 128 + signal number, and one line saying what happened
        assert code == 128 + sig, f"exit {code} after {sig.name}:\n{output}"
        assert f"hasten launch: stopped by {sig.name}; all processes were ended." in output, output
        # the shared-memory board of the collective checks goes with the launcher (torchrun mode makes one)
        left_boards = list(Path("/dev/shm").glob(f"hasten-board-*-{process.pid}-*"))
        assert not left_boards, f"the launcher left its collective board behind: {left_boards}"
    assert exit_seconds < EXIT_WITHIN
