"""The one atomic file write of hasten (checkpoints, weights, config files): temp file + rename.

Imports nothing heavy (no torch), so the command line can use it too.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Callable

__all__ = ["atomic_write", "atomic_write_text"]


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Read once at import: reading it means setting it, which is not safe while other threads create files.
_UMASK = _read_umask()


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], object]) -> None:
    """Call `write(tmp_path)` then rename onto `path`: readers never see a half-written file.

    The file gets the mode ``open()`` would give it (0666 less the umask),
    not mkstemp's 0600.

    Example:
        >>> import tempfile, pathlib
        >>> target = pathlib.Path(tempfile.mkdtemp()) / "x.txt"
        >>> atomic_write(target, lambda p: pathlib.Path(p).write_text("hi"))
        >>> target.read_text()
        'hi'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; give what open() would
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` atomically (see `atomic_write`).

    Example:
        >>> import tempfile, pathlib
        >>> target = pathlib.Path(tempfile.mkdtemp()) / "x.yaml"
        >>> atomic_write_text(target, "a: 1\\n"); target.read_text()
        'a: 1\\n'
    """
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))
