"""The mismatch check through shared memory, when every process runs on this machine.

Before each explicit collective, every process must agree that all are in
the same operation with the same shapes and dtypes
(`collectives.check_same_everywhere`). Across machines that agreement is a
tiny all-reduce: ~0.3 ms on gloo, and a device synchronisation on NCCL.
When `hasten launch` (or `notebook_launcher`) started every process on one
machine, it gives them a directory in shared memory instead, and the
agreement becomes a *board*: one 64-bit word per process and check, read by
the others, with no network and no GPU involved.

A word is ``(check number << 32) | signature``, written with one aligned
8-byte store. Each process has two slots, used alternately by check
number: a process cannot pass check k before every process has posted k,
so nobody can overwrite its slot for k (at k + 2) while another still reads
it. A launcher removes the directories of launchers that were killed
before they could (SIGKILL). Each start of the workers gets a new file (the launcher empties the
directory before each of its attempts; torch's agent restarts are told
apart by their restart count), so no stale word passes for a current one.

The launcher's side (creating, emptying and removing the directory) is
`hasten.launch.leftovers.shared_directory`; this module is the processes' side.
"""

from __future__ import annotations

import mmap
import os
import time

from ..launch_spec import BOARD_DIR_ENV, RESTART_COUNT_VAR

__all__ = ["BOARD_DIR_ENV", "Board", "board"]

_SPIN = 50  # yields before the first sleep: processes that arrive together agree in microseconds
_NAP = 50e-6  # then a poll every 50 µs (more polling only takes the CPU from the late process)


class Board:
    """Shared words through which the processes of one machine agree on a 32-bit signature per check.

    Example:
        >>> import tempfile
        >>> single = Board(os.path.join(tempfile.mkdtemp(), "b"), rank=0, world_size=1, timeout=1.0)
        >>> single.agree(1234) is None  # None: every process posted the same signature
        True
    """

    def __init__(self, path: str, rank: int, world_size: int, timeout: float) -> None:
        size = world_size * 2 * 8
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < size:  # every process may try; a file already grown keeps its words
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._words = memoryview(self._map).cast("Q")
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self._number = 0

    def agree(self, signature: int) -> list[int] | None:
        """Post `signature` for the next check and wait for every process's; None when all are equal, else all of them.

        Waits at most `timeout` seconds, then raises a RuntimeError saying so
        (the watchdog reports a certain deadlock long before that).
        """
        # 1, 2, ..., 2**32 - 2, 1, ...: never 0 (a fresh file's zeros are no check's words), and the slots
        # keep alternating across the wrap (the cycle's length is even).
        self._number = self._number % 0xFFFFFFFE + 1
        tag, parity = self._number, self._number & 1
        words = self._words
        words[2 * self.rank + parity] = (tag << 32) | (signature & 0xFFFFFFFF)
        others = range(parity, 2 * self.world_size, 2)
        reads, deadline = 0, None
        while True:
            seen = [words[i] for i in others]
            if all(word >> 32 == tag for word in seen):
                break
            reads += 1
            if reads <= _SPIN:
                os.sched_yield()  # a late process on the same core runs now; on a free core this returns at once
            else:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.timeout
                elif now > deadline:
                    late = [r for r, word in enumerate(seen) if word >> 32 != tag]
                    raise RuntimeError(f"timed out after {self.timeout:g} s waiting for rank(s) {late} to reach "
                                       f"the same collective (check #{tag}).")
                time.sleep(_NAP)
        signatures = [word & 0xFFFFFFFF for word in seen]
        if len(set(signatures)) == 1:
            return None
        # A difference is re-read once: a word is final once its tag is there, so this rules out a torn read.
        time.sleep(1e-3)
        signatures = [words[i] & 0xFFFFFFFF for i in others]
        return None if len(set(signatures)) == 1 else signatures

    def close(self) -> None:
        self._words.release()
        self._map.close()


_board: Board | None = None
_board_for: tuple[int, int] | None = None  # (rank, world size) the cached answer is for


def board() -> Board | None:
    """This process's board, or None when the processes do not all run on this machine under a hasten launcher.

    Every process decides the same way (same environment, same group size),
    so all use the board or all use the all-reduce.
    """
    global _board, _board_for
    import torch.distributed as dist

    key = (dist.get_rank(), dist.get_world_size())
    if key == _board_for:
        return _board
    if _board is not None:
        _board.close()
    _board, _board_for = None, key
    directory = os.environ.get(BOARD_DIR_ENV)
    rank, world_size = key
    # Decided from the environment alone (never from what is on disk), so no process can decide otherwise.
    if not directory or os.environ.get("RANK") != str(rank):
        return None
    if os.environ.get("LOCAL_WORLD_SIZE") != str(world_size) or os.environ.get("WORLD_SIZE") != str(world_size):
        return None  # several machines, or a group other than the launched one
    os.makedirs(directory, exist_ok=True)
    name = f"restart-{os.environ.get(RESTART_COUNT_VAR, '0')}.words"
    _board = Board(os.path.join(directory, name), rank, world_size, _group_timeout())
    return _board


def _group_timeout() -> float:
    import torch
    import torch.distributed as dist

    try:
        return dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout.total_seconds()  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - a private attribute: fall back to hasten's default
        from .group import DEFAULT_TIMEOUT

        return DEFAULT_TIMEOUT.total_seconds()
