"""Why a checkpoint could not be written, in one sentence: the reason, the directory, the fix, and what is kept.

Writers report a full disk in different ways: Python raises an OSError
with its errno, safetensors says "(os error 28)", and torch.save to a path
only says "unexpected pos 576 vs 534" (its C++ stream drops the errno). So
the reason is read from the error where it is there, and otherwise found
by looking at the disk the moment the write failed (before the staging
directory is removed): no free blocks is a full disk, a file as large as
the process's file-size limit (``ulimit -f``) is a file too large, a
directory this process cannot write is a permission problem.

Example:
    >>> import errno
    >>> failure_errno(OSError(errno.ENOSPC, "No space left on device"), Path("."), None) == errno.ENOSPC
    True
"""

from __future__ import annotations

import errno
import os
import re
import resource
from pathlib import Path

from ..core.errors import CheckpointWriteError
from .commit import is_checkpoint, staging_path
from .project import latest_checkpoint

__all__ = ["FileWriteFailed", "failure_errno", "write_failure"]

_ACCESS = ("permission is denied", "make the directory writable for this user or choose another one")
# errno -> (what happened, what to do)
_REASONS: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("the disk is full", "free space or set total_limit"),
    errno.EDQUOT: ("the disk quota is used up", "free space or set total_limit"),
    errno.EFBIG: ("a file would be larger than this process may write",
                  "raise the file-size limit (ulimit -f) or save to a filesystem that takes larger files"),
    errno.EACCES: _ACCESS,
    errno.EPERM: _ACCESS,
    errno.EROFS: ("the filesystem is read-only", "choose a directory on a writable filesystem"),
}


class FileWriteFailed(Exception):
    """Writing `name` failed (the error it raised is the ``__cause__``); raised inside saving only."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def failure_errno(error: BaseException, directory: Path, file: Path | None) -> int | None:
    """The errno behind a failed write, from the error itself or, failing that, from the disk's state now."""
    chain = _chain(error)
    for link in chain:
        if isinstance(link, OSError) and link.errno in _REASONS:
            return link.errno
    text = " ".join(str(link) for link in chain)
    match = re.search(r"os error (\d+)", text)  # Rust's std::io errors (safetensors)
    if match and int(match.group(1)) in _REASONS:
        return int(match.group(1))
    for code in _REASONS:
        if os.strerror(code) in text:
            return code
    if not isinstance(error, (OSError, RuntimeError)):  # e.g. a TypeError while pickling: not the disk's doing
        return None
    try:  # the writer dropped the errno (torch's C++ stream raises a RuntimeError): look at the disk as the write left it
        disk = os.statvfs(directory if directory.exists() else directory.parent)
        if (disk.f_bfree if os.geteuid() == 0 else disk.f_bavail) == 0:
            return errno.ENOSPC
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY and file is not None and file.is_file() and file.stat().st_size >= limit:
            return errno.EFBIG
        if directory.exists() and not os.access(directory, os.W_OK):
            return errno.EACCES
    except OSError:
        pass
    return None


def _kept(target: Path, automatic: bool) -> str:
    if automatic:
        previous = latest_checkpoint(target.parent)
        return (f"the previous checkpoint {previous} is kept" if previous is not None
                else "there is no earlier checkpoint to keep")
    if is_checkpoint(target):
        return f"the checkpoint already at {target} is kept"
    return "no checkpoint was published there"


def write_failure(error: BaseException, target: Path, automatic: bool, rank: int,
                  name: str | None = None) -> CheckpointWriteError:
    """The one-sentence error every process raises when process `rank` could not write checkpoint `target`.

    Example:
        >>> import errno, tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> print(write_failure(OSError(errno.ENOSPC, "No space left on device"), root / "ckpt", False, 1, "optimizer.bin"))
        ... # doctest: +ELLIPSIS
        save_state could not write .../ckpt (process 1, optimizer.bin): the disk is full (No space left on device); free space or set total_limit; no checkpoint was published there.
    """
    if isinstance(error, FileWriteFailed):
        name, error = error.name, error.__cause__ or error
    where = f"process {rank}" + (f", {name}" if name else "")
    staging = staging_path(target)
    code = failure_errno(error, staging if staging.exists() else target.parent, staging / name if name else None)
    if code is None:
        reason = f"{type(error).__name__}: {error}"
    else:
        what, fix = _REASONS[code]
        reason = f"{what} ({os.strerror(code)}); {fix}"
    return CheckpointWriteError(f"save_state could not write {target} ({where}): {reason}; {_kept(target, automatic)}.")
