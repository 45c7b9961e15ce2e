"""Carrying out a launch plan: in this process for one rank, through torch.distributed.run for several."""

from __future__ import annotations

import os
import signal
import sys

from .plan import LaunchPlan

__all__ = ["execute"]


def execute(plan: LaunchPlan) -> int:
    """Start the plan's processes, wait for them, and return the exit code for the shell.

    When a rank fails, the others are stopped and one line names the rank
    that failed first and why (its traceback was printed by the rank itself).
    """
    env = plan.worker_env()
    if not plan.multi_process:
        os.environ.clear()
        os.environ.update(env)
        from .worker import main as worker_main

        return worker_main(plan.worker_argv())

    os.environ.clear()
    os.environ.update(env)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(plan.torchrun_argv()))
    except ChildFailedError as failed:
        rank, failure = failed.get_first_failure()
        sys.stderr.write(_failure_line(rank, failure, plan.num_processes) + "\n")
        code = failure.exitcode
        return code if 0 < code < 256 else 1
    return 0


def _failure_line(rank: int, failure: object, world_size: int) -> str:
    exitcode = getattr(failure, "exitcode", 1)
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        reason = f"was killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    else:
        reason = f"failed with exit code {exitcode}"
    message = getattr(failure, "message", "")
    if isinstance(message, str) and message and not message.startswith("To enable traceback"):
        reason += f": {message.splitlines()[0]}"
    return f"hasten launch: rank {rank} of {world_size} {reason} (its traceback is above); the other ranks were stopped."
