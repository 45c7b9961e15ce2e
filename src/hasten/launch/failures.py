"""What went wrong in a launched run: reading torchelastic's failure records, finding the root cause.

Shared by `hasten launch` (launch/run.py) and the notebook launchers: when
one rank raises, the others fail too ("connection closed by peer") or are
stopped by the agent (SIGTERM), often within the same second. Only the
root cause is worth showing.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import time
from typing import Any, Mapping

from ..process.exit import PEER_LOST_MARKERS, is_peer_lost  # what a rank that lost a peer reports

__all__ = ["PEER_LOST_MARKERS", "is_peer_lost", "failure_message", "error_and_traceback", "signal_name",
           "root_cause", "all_failures", "failure_summary"]


def root_cause(failures: dict[int, Any]) -> tuple[int, Any]:
    """The failure that caused the others.

    torchrun records the ranks it stopped (SIGTERM, no error file) and the
    ranks that lost a peer as failures too, often within the same second
    as the real one; those rank last, then earlier timestamps first.
    """
    def collateral(item: tuple[int, Any]) -> tuple[bool, bool, bool, float, int]:
        rank, failure = item
        stopped = getattr(failure, "exitcode", 1) == -signal.SIGTERM
        message = failure_message(failure)
        silent = not message or message.startswith("To enable traceback")  # torch's placeholder: no error file
        return stopped, is_peer_lost(message), silent, getattr(failure, "timestamp", 0), rank

    return min(failures.items(), key=collateral)


def failure_message(failure: Any) -> str:
    """The "Type: message" line of a failure (its error file's message), "" when it left none."""
    message = getattr(failure, "message", "")
    if isinstance(message, dict):  # torchelastic's error-file layout
        message = message.get("message", "")
    return str(message or "")


def all_failures(failures: Mapping[int, Any], log_dir: str, first_rank: int) -> dict[int, Any]:
    """Every failed worker of the last attempt: the agent reports only the first one it saw die.

    The others are read from their error files (``<log_dir>/<run>/attempt_K/<local rank>/error.json``);
    `first_rank` is the global rank of this machine's local rank 0. A file a stopped worker was still
    writing (empty or cut short) counts as no file: the launcher reports the run's failure, never a
    JSONDecodeError of its own.
    """
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure  # torch: only when used

    found: dict[int, Any] = dict(failures)
    attempts = glob.glob(os.path.join(log_dir, "*", "attempt_*"))
    if not attempts:
        return found
    last = max(attempts, key=lambda path: int(path.rsplit("_", 1)[-1]) if path.rsplit("_", 1)[-1].isdigit() else -1)
    for path in glob.glob(os.path.join(last, "*", "error.json")):
        local_rank = os.path.basename(os.path.dirname(path))
        if local_rank.isdigit() and first_rank + int(local_rank) not in found:
            readable = path if _complete_json(path) else "<N/A>"  # torch reads the file again itself
            found[first_rank + int(local_rank)] = ProcessFailure(
                local_rank=int(local_rank), pid=-1, exitcode=1, error_file=readable
            )
    return found


def _complete_json(path: str, wait: float = 1.0) -> bool:
    """Whether `path` holds a whole JSON document, waiting up to `wait` seconds for a writer to finish it."""
    deadline = time.monotonic() + wait
    while True:
        try:
            with open(path, encoding="utf-8") as handle:
                json.load(handle)
            return True
        except (OSError, ValueError):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def error_and_traceback(failure: Any) -> tuple[str, str]:
    """("Type: message", traceback text) from a torchelastic error file's data ("" when absent)."""
    data = getattr(failure, "error_file_data", None) or {}
    message = data.get("message", "") if isinstance(data, dict) else ""
    if isinstance(message, dict):
        extra = message.get("extraInfo", {}) or {}
        return str(message.get("message", "")), str(extra.get("py_callstack", ""))
    if message == "<NONE>":  # torchelastic's placeholder when the worker left no error file
        return "", ""
    return str(message or ""), ""


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def failure_summary(failures: dict[int, Any], world_size: int) -> str:
    """One line for the terminal: which rank failed first and why, and what happened to the others."""
    rank, failure = root_cause(failures)
    exitcode = getattr(failure, "exitcode", 1)
    if exitcode < 0:
        name = signal_name(-exitcode)
        reason = f"was killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    else:
        reason = f"exited with code {exitcode}"
    message = failure_message(failure)
    if message and not message.startswith(("To enable traceback", "Signal ")):
        reason = f"failed with {message.splitlines()[0]} (traceback above)"
    others = [r for r in failures if r != rank]
    # stopped by the launcher, lost a peer, or reported the same verdict (a deadlock every process saw)
    stopped = [r for r in others
               if getattr(failures[r], "exitcode", 0) == -signal.SIGTERM or is_peer_lost(failure_message(failures[r]))
               or (message and failure_message(failures[r]) == message)]
    tail = ""
    if len(stopped) == len(others) and others:
        tail = "; the other ranks were stopped"
    elif others:
        tail = f"; {len(others)} other rank(s) ended too: {', '.join(map(str, sorted(others)))}"
    return f"hasten launch: rank {rank} of {world_size} {reason}{tail}."
