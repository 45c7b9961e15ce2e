"""`accelerate launch`'s one child process (hasten.launch.child), as Accelerate 1.16's launcher runs it.

Its stderr is written through and its tail kept for the error; Ctrl-C / SIGTERM stop the child and everything
it started (a grandchild in a session of its own too) and report 130 / 128 + the signal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from hasten.launch.child import CHILD_STDERR_CHUNK_SIZE, CHILD_STDERR_TAIL_CHUNKS, run_child


def test_the_tail_of_a_flood_is_kept_and_everything_is_written_through(capfd):
    flood = ("import sys\nfor _ in range(30_000):\n    print('x' * 40, file=sys.stderr)\n"
             "print('the cause', file=sys.stderr)\nsys.exit(5)\n")
    run = run_child([sys.executable, "-c", flood])
    written = capfd.readouterr().err
    assert run.code == 5 and run.signum is None
    assert written.count("x" * 40) == 30_000 and written.rstrip().endswith("the cause")
    assert run.stderr_tail.rstrip().endswith("the cause")
    assert len(run.stderr_tail) <= CHILD_STDERR_CHUNK_SIZE * CHILD_STDERR_TAIL_CHUNKS < len(written)


def test_a_child_killed_by_a_signal_reports_128_plus_it():
    assert run_child([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]).code == 137


@pytest.mark.timeout(60)
def test_sigterm_stops_the_whole_tree_and_reports_143(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    child = (f"import subprocess, sys, time\n"
             f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
             f"open({str(pid_file)!r}, 'w').write(str(p.pid))\ntime.sleep(120)\n")
    previous = signal.getsignal(signal.SIGTERM)

    def terminate_launcher() -> None:
        while not pid_file.exists() or not pid_file.read_text():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)  # what `kill LAUNCHER` does

    threading.Thread(target=terminate_launcher, daemon=True).start()
    started = time.monotonic()
    run = run_child([sys.executable, "-c", child])
    assert (run.code, run.signum) == (143, signal.SIGTERM)
    assert time.monotonic() - started < 30  # not the children's 120 s
    grandchild = int(pid_file.read_text())
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
    assert signal.getsignal(signal.SIGTERM) == previous  # the launcher's handler is put back


def test_accelerate_launch_raises_with_the_childs_stderr(tmp_path, capfd):
    from hasten.commands.launch import launch_command, launch_command_parser

    script = tmp_path / "fails.py"
    script.write_text("raise ValueError('the real cause')\n")
    args = launch_command_parser().parse_args(["--num_processes", "1", "--num_machines", "1", "--mixed_precision",
                                               "no", "--dynamo_backend", "no", str(script)])
    with pytest.raises(subprocess.CalledProcessError) as raised:
        launch_command(args)
    assert "the real cause" in raised.value.stderr and "the real cause" in capfd.readouterr().err
    assert isinstance(raised.value.__cause__, RuntimeError) and "the real cause" in str(raised.value.__cause__)
    missing = launch_command_parser().parse_args(["--num_processes", "1", str(tmp_path / "absent.py")])
    with pytest.raises(subprocess.CalledProcessError) as raised:  # fails in the child, as Accelerate's does
        launch_command(missing)
    assert "absent.py" in raised.value.stderr
