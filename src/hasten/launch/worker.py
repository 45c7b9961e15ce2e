"""Runs the user's script inside each launched process.

`hasten launch` starts ``python -m hasten.launch.worker [--module] TARGET ARGS...``
on every rank instead of the script itself, so that whatever the script
does, each rank

- reports a crash with its rank in the terminal and in torchelastic's
  error file (the launcher then names the failed rank), and
- leaves the process group cleanly on success (barrier + destroy), which
  gloo needs to avoid SIGABRT at interpreter exit.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from types import TracebackType

from .failures import is_peer_lost

__all__ = ["main", "export_peer_environment", "run_target", "record_failure", "exit_now", "exit_cleanly", "leave_process_group", "die_with_launcher"]

_HIDDEN_FILES = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>"}

def run_target(target: str, args: list[str], module: bool = False) -> None:
    """Run a script path or module as ``__main__`` with `args` as its sys.argv[1:]."""
    if module:
        sys.argv = [target, *args]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        runpy.run_path(target, run_name="__main__")


def _is_hidden(filename: str) -> bool:
    return filename in _HIDDEN_FILES or os.path.abspath(filename) in _HIDDEN_FILES


def _user_traceback(tb: TracebackType | None) -> TracebackType | None:
    """Drop the worker's and runpy's own frames from the top of a traceback."""
    while tb is not None and _is_hidden(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb


def _rank() -> str:
    from hasten.topology import ProcessTopology  # torch-free: works under torchrun, MPI and SLURM

    try:
        return str(ProcessTopology.from_env().rank)
    except ValueError:
        return os.environ.get("RANK", "?")


def record_failure(error: BaseException) -> None:
    error.__traceback__ = _user_traceback(error.__traceback__)
    if is_peer_lost(str(error)):
        # Keep the terminal on the root cause: one line for the collateral failure.
        sys.stderr.write(f"[hasten] rank {_rank()} stopped: another process of the run went away ({type(error).__name__}).\n")
    else:
        header = f"[hasten] rank {_rank()} failed with {type(error).__name__}: {error}"
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        sys.stderr.write(f"{header}\n{text}")
    if os.environ.get("TORCHELASTIC_ERROR_FILE"):
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        handler = get_error_handler()
        handler.initialize()
        handler.record_exception(error)


def is_preemption(stop: SystemExit) -> bool:
    preemption = sys.modules.get("hasten.checkpointing.preemption")  # loaded only if the script used it
    return preemption is not None and isinstance(stop, preemption.Preempted)


def leave_process_group(success: bool) -> None:
    if "torch.distributed" not in sys.modules:
        return  # the script never touched torch.distributed
    from hasten.state import shutdown_process_group

    shutdown_process_group(success=success)


def exit_now(code: int) -> None:
    # After a failure, skip interpreter teardown: gloo may abort in it and
    # turn a clean "exit 1" into a confusing SIGABRT.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def exit_cleanly(code: int = 0) -> None:
    """End a finished rank as the interpreter would, but skip its C++ teardown.

    At interpreter teardown, C++ objects that a gloo process group leaves
    behind (a group the script still references after destroy_process_group,
    say) are destroyed in no fixed order, and now and then one of them is a
    still-joinable thread: "terminate called without an active exception",
    SIGABRT, after all the work was done. So a finished rank does what
    teardown would do for the user — wait for non-daemon threads, run the
    atexit handlers, flush every open file — and then leaves with
    ``os._exit``: the same result, every time.
    """
    import atexit
    import gc
    import io
    import threading

    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # prints (does not raise) the errors of failing handlers, as at a normal exit
    for obj in gc.get_objects():
        if issubclass(type(obj), io.IOBase):  # type(), not isinstance: no __class__ property is run
            try:
                if not obj.closed and obj.writable():
                    obj.flush()
            except Exception:  # noqa: BLE001 - a broken file must not turn a finished run into a failure
                pass
    exit_now(code)


def die_with_launcher() -> None:
    """Ask Linux to SIGTERM this rank when its launcher dies, even by SIGKILL.

    torchrun starts each rank in a session of its own, so killing the
    launcher's process group would otherwise leave the ranks running; an
    MPI rank's parent is mpirun (or Open MPI's orted), whose SIGKILL would
    leave it running too.
    """
    launched = ("TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK")
    if any(name in os.environ for name in launched):
        from .lifetime import arm_parent_death_signal

        arm_parent_death_signal(os.getppid())


def export_peer_environment() -> None:
    """Add the variables Accelerate's launcher would export (derived from the launch spec) for the script to read."""
    from hasten.launch_spec import SPEC_ENV_VAR, LaunchSpec

    if os.environ.get(SPEC_ENV_VAR):
        os.environ.update(LaunchSpec.from_env().peer_env())


def main(argv: list[str] | None = None, exit_when_done: bool = True) -> int:
    """Run the target on this rank; with `exit_when_done` a finished rank ends through `exit_cleanly`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    die_with_launcher()
    module = bool(argv) and argv[0] == "--module"
    if module:
        argv = argv[1:]
    if not argv:
        sys.stderr.write("usage: python -m hasten.launch.worker [--module] TARGET [ARGS...]\n")
        return 2
    target, args = argv[0], argv[1:]
    export_peer_environment()
    try:
        run_target(target, args, module=module)
    except SystemExit as stop:
        if is_preemption(stop):  # the checkpoint is saved on every rank: leave together, quietly
            leave_process_group(success=True)
            exit_now(int(stop.code))
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if code != 0:
            if not isinstance(stop.code, int):
                sys.stderr.write(f"{stop.code}\n")
            sys.stderr.write(f"[hasten] rank {_rank()} exited with code {code}\n")
            exit_now(code)
    except KeyboardInterrupt:  # Ctrl-C reaches every rank: one line each, not N tracebacks
        sys.stderr.write(f"[hasten] rank {_rank()} interrupted.\n")
        exit_now(130)
    except BaseException as error:  # noqa: BLE001 - every failure must be reported with its rank
        record_failure(error)
        exit_now(1)
    leave_process_group(success=True)
    if exit_when_done:
        exit_cleanly(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
