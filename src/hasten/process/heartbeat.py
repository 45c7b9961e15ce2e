"""A launched process's sign of life: a file its own thread renews every second.

A process whose every thread stops — SIGSTOP, a paused VM, a read from a
hung file system in a call that holds the GIL — stops renewing it; a
process that computes, saves, compiles or waits for data does not (the
heartbeat thread runs while the main thread is in torch's C++ code, in I/O
or in a queue, and Python hands it the GIL every few milliseconds
otherwise). The launcher reads the files (`hasten.launch.liveness`) and ends
a run whose process has been silent for its limit, naming it.

The file, ``<HASTEN_HEARTBEAT_DIR>/rank-<R>.json``, holds the rank, pid,
host, a beat number and where the process waits, as its watchdog last
published it (`hasten.process.watchdog.published`), so the launcher's
message can say what the others were waiting in. Under torch's elastic
agent it also holds the process's place in the agents' round (`seat`):
an elastic run's launcher learns from it which round of the group its
machine is in, and as which machine (`hasten.launch.peer_watch`). It is replaced atomically
once a second (where it cannot be written, its time is renewed instead):
nothing runs in the training thread.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from typing import Any, Mapping

from .launch_spec import HEARTBEAT_DIR_ENV
from . import watchdog

__all__ = ["BEAT_EVERY", "start", "stop", "running", "heartbeat_path", "read_heartbeat", "seat"]

BEAT_EVERY = 1.0  # seconds between two beats

_thread: threading.Thread | None = None
_stop = threading.Event()


def heartbeat_path(directory: str, rank: int) -> str:
    """The heartbeat file of `rank` in `directory`.

    Example:
        >>> heartbeat_path("/run/hb", 3)
        '/run/hb/rank-3.json'
    """
    return os.path.join(directory, f"rank-{rank}.json")


def read_heartbeat(path: str) -> dict[str, Any] | None:
    """What a heartbeat file holds (None when it is missing or unreadable).

    Example:
        >>> read_heartbeat("/nonexistent/rank-0.json") is None
        True
    """
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def seat(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """This process's place in the elastic agents' round, from the variables torch's agent sets (empty elsewhere).

    ``round`` names the round (the address of its process group's store,
    new in every round), ``machine`` is this machine's place in it and
    ``machines`` how many machines the round has.

    Example:
        >>> seat({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "41234", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"})
        {'round': '10.0.0.1:41234', 'machine': 1, 'machines': 2}
        >>> seat({})
        {}
    """
    env = os.environ if env is None else env
    values = [env.get(name, "") for name in ("MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "GROUP_WORLD_SIZE")]
    if not all(values) or not all(value.isdigit() for value in values[1:]):
        return {}
    return {"round": f"{values[0]}:{values[1]}", "machine": int(values[2]), "machines": int(values[3])}


def running() -> bool:
    """Whether this process's heartbeat thread runs."""
    return _thread is not None and _thread.is_alive()


def start(directory: str | None = None, rank: int | None = None) -> threading.Thread | None:
    """Start the heartbeat thread (once per process) when a launcher asked for one (`HASTEN_HEARTBEAT_DIR`).

    Example:
        >>> start(directory="") is None  # no directory: no heartbeat
        True
    """
    global _thread
    directory = os.environ.get(HEARTBEAT_DIR_ENV, "") if directory is None else directory
    if not directory or running():
        return None
    if rank is None:
        from .exit import rank_label

        label = rank_label()
        if not label.isdigit():
            return None
        rank = int(label)
    identity = {"rank": rank, "pid": os.getpid(), "host": socket.gethostname(), **seat()}
    try:  # the launcher made the directory; where it cannot be written (another host's ranks) nobody listens
        _beat_once(heartbeat_path(directory, rank), identity, 0)  # the launcher knows the pid from the start
    except OSError:
        return None
    _stop.clear()
    _thread = threading.Thread(target=_beat, args=(heartbeat_path(directory, rank), identity),
                               name="hasten-heartbeat", daemon=True)
    _thread.start()
    return _thread


def stop() -> None:
    """Stop the heartbeat thread (for measurements; a launched process keeps it until it ends).

    Example:
        >>> stop()  # none running: nothing to do
    """
    global _thread
    thread, _thread = _thread, None
    if thread is not None:
        _stop.set()
        thread.join()


def _beat_once(path: str, identity: dict[str, Any], beat: int) -> None:
    record = dict(identity, beat=beat, wait=watchdog.published())
    temporary = f"{path}.{identity['pid']}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    os.replace(temporary, path)  # a reader sees the old beat or the new one, never half of one


def _beat(path: str, identity: dict[str, Any]) -> None:
    beat = 0
    while not _stop.wait(BEAT_EVERY):
        beat += 1
        try:
            _beat_once(path, identity, beat)
        except FileNotFoundError:  # the launcher removed its directory (the run is ending): nobody listens
            return
        except Exception:  # noqa: BLE001 - a full disk, say: the file's time is a beat too (the launcher reads both)
            try:
                os.utime(path)
            except OSError:
                pass
