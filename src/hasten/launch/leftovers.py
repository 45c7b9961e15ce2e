"""Directories a launcher owns, which a launcher killed with SIGKILL cannot remove: the next launch does.

Each is named ``hasten-<kind>-<host>-<launcher pid>-<random>``. Creating one
first removes those of the same kind on this host whose launcher is gone.
A pid that exists (even reused by another program) keeps its directory: a
leftover may stay a little longer, a live run's directory is never taken.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile

__all__ = ["owned_directory", "prefix"]


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
