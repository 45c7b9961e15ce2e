"""Directories a launcher owns, which a launcher killed with SIGKILL cannot remove: the next launch does.

The run directory (error files, progress file, preemption record) and the
shared-memory directory of the processes' board (`shared_directory`). Each is named ``hasten-<kind>-<host>-<launcher pid>-<random>``. Creating one
first removes those of the same kind on this host whose launcher is gone.
A pid that exists (even reused by another program) keeps its directory: a
leftover may stay a little longer, a live run's directory is never taken.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator

from ..process.launch_spec import BOARD_DIR_ENV

__all__ = ["owned_directory", "prefix", "shared_directory", "empty"]


def prefix(kind: str) -> str:
    """The name prefix of this host's directories of `kind`; the launcher's pid follows it.

    Example:
        >>> prefix("board").startswith("hasten-board-")
        True
    """
    host = "".join(c if c.isalnum() or c in "-." else "_" for c in socket.gethostname())[:64]
    return f"hasten-{kind}-{host}-"


def _remove_orphans(parent: str, kind: str) -> None:
    start = prefix(kind)
    for name in os.listdir(parent):
        pid = name[len(start):].split("-", 1)[0] if name.startswith(start) else ""
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
        except PermissionError:  # alive, another user's
            pass


def owned_directory(kind: str, parent: str | None = None) -> str:
    """Create a directory owned by this process (the caller removes it when done); orphans of `kind` go first.

    Example:
        >>> path = owned_directory("example")
        >>> os.path.basename(path).startswith(prefix("example") + str(os.getpid()) + "-")
        True
        >>> shutil.rmtree(path)
    """
    parent = parent or tempfile.gettempdir()
    _remove_orphans(parent, kind)
    return tempfile.mkdtemp(prefix=f"{prefix(kind)}{os.getpid()}-", dir=parent)


@contextlib.contextmanager
def shared_directory() -> Iterator[str]:
    """Create the board directory for one launch on this machine, export it to the workers, remove it afterwards.

    The processes' side of the board is `hasten.process.board`.

    Example:
        >>> with shared_directory() as path:
        ...     os.path.isdir(path) and os.environ[BOARD_DIR_ENV] == path
        True
    """
    parent = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    path = owned_directory("board", parent)
    previous = os.environ.get(BOARD_DIR_ENV)
    os.environ[BOARD_DIR_ENV] = path
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        if previous is None:
            os.environ.pop(BOARD_DIR_ENV, None)
        else:
            os.environ[BOARD_DIR_ENV] = previous


def empty(directory: str) -> None:
    """Remove the boards of earlier attempts (call it while no worker runs).

    Example:
        >>> empty(tempfile.mkdtemp())
    """
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))
