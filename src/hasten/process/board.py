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
it.

A small collective of CPU tensors needs no network at all (`share`):
beside each word a process posts the tensors' bytes (up to `PAYLOAD`
bytes, with the check number and a CRC-32 of them, written before the
word), and once every word of the check is there with the same signature,
each process computes the result (the sum, the concatenation, the
broadcast source's values) from everybody's bytes. One exchange through
shared memory replaces the agreement *and* the collective: a gloo
all-reduce of one float is several thread hand-offs and loopback
messages. The payload slots alternate like the words, so the same reason
keeps them from being overwritten while read; the CRC makes a reader that
sees the word before the bytes (a weakly ordered CPU) read again.

A process whose peers are late re-reads for 20 µs, then sleeps in the
kernel on the first late one's word (`futex`), and each post wakes whoever
sleeps on it: polling (yielding the core, napping 50 µs) cost hundreds of
microseconds on a loaded machine. Without futexes the board polls. A launcher removes the directories of launchers that were killed
before they could (SIGKILL). Each start of the workers gets a new file (the launcher empties the
directory before each of its attempts; torch's agent restarts are told
apart by their restart count), so no stale word passes for a current one.

A process that leaves the script (`mark_left`) writes a *left* word (tag
``0xFFFFFFFF``, which no check number takes, with its pid) into the slot
of the check it will never post: a process waiting in that check sees it
at its next poll and raises at once, naming who left and where it waits,
instead of polling until the group's timeout. The slot is free: every
process finished the check that last used it before the leaving one could
pass its own last check.

The launcher's side (creating, emptying and removing the directory) is
`hasten.launch.leftovers.shared_directory`; this module is the processes' side.
"""

from __future__ import annotations

import mmap
import os
import time
import zlib

from ..core.errors import CollectiveDeadlock
from .launch_spec import BOARD_DIR_ENV, RESTART_COUNT_VAR
from . import watchdog
from .group import before_leaving

__all__ = ["BOARD_DIR_ENV", "Board", "board", "mark_left", "LEFT_REASONS", "PAYLOAD"]

_LEFT = 0xFFFFFFFF  # the tag of a process that left: check numbers run 1 .. 2**32 - 2
# What a process that left did (its code is kept in the word beside its pid).
LEFT_REASONS = ("left the script", "returned from the launched function", "ended its process group")

_SPIN = 50  # yields before the first sleep: processes that arrive together agree in microseconds
_NAP = 50e-6  # then a poll every 50 µs (more polling only takes the CPU from the late process)
_BUSY = 20e-6  # with futexes: re-read this long without a system call, then sleep until the late one posts
_SLEEP = 0.05  # the longest futex sleep: the deadline and the words of processes that left are looked at in between
PAYLOAD = 504  # bytes of tensors a process can post beside its word (`share`); larger collectives use the network
_SLOT = 8 + PAYLOAD  # a payload slot: (check number << 32) | CRC-32 of the bytes, then the bytes


class Board:
    """Shared words through which the processes of one machine agree on a 32-bit signature per check.

    Example:
        >>> import tempfile
        >>> single = Board(os.path.join(tempfile.mkdtemp(), "b"), rank=0, world_size=1, timeout=1.0)
        >>> single.agree(1234) is None  # None: every process posted the same signature
        True
    """

    def __init__(self, path: str, rank: int, world_size: int, timeout: float) -> None:
        self._payloads = world_size * 2 * 8  # where the payload slots start, after the words
        size = self._payloads + world_size * 2 * _SLOT
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < size:  # every process may try; a file already grown keeps its words
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._words = memoryview(self._map).cast("Q")
        from . import futex  # ctypes, only once a board exists (not at `import hasten`)

        self._futex = futex
        self._base = futex.address(self._map) if futex.available else 0
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self._number = 0

    def agree(self, signature: int) -> list[int] | None:
        """Post `signature` for the next check and wait for every process's; None when all are equal, else all of them.

        Waits at most `timeout` seconds, then raises a RuntimeError saying so
        (the watchdog reports a certain deadlock long before that).
        """
        return self.share(signature)[0]

    def share(self, signature: int, payload: bytes = b"") -> tuple[list[int] | None, list[bytes]]:
        """`agree`, with `payload` (at most `PAYLOAD` bytes) posted beside the word: also returns every process's payload.

        The payloads are read only when the signatures agree (an empty list
        otherwise).

        Example:
            >>> import tempfile
            >>> single = Board(os.path.join(tempfile.mkdtemp(), "b"), rank=0, world_size=1, timeout=1.0)
            >>> single.share(7, b"abc")
            (None, [b'abc'])
        """
        if len(payload) > PAYLOAD:  # refused before the check is counted: the numbers stay in step with the others'
            raise ValueError(f"a board payload holds at most {PAYLOAD} bytes, got {len(payload)}; send it over the network.")
        # 1, 2, ..., 2**32 - 2, 1, ...: never 0 (a fresh file's zeros are no check's words), and the slots
        # keep alternating across the wrap (the cycle's length is even).
        self._number = self._number % 0xFFFFFFFE + 1
        tag, parity = self._number, self._number & 1
        words = self._words
        if payload:
            start = self._payloads + (2 * self.rank + parity) * _SLOT
            self._map[start + 8:start + 8 + len(payload)] = payload
            words[start // 8] = (tag << 32) | zlib.crc32(payload)  # the bytes, then their check, then the word
        words[2 * self.rank + parity] = (tag << 32) | (signature & 0xFFFFFFFF)
        if self._base:
            self._futex.wake(self._tag_address(2 * self.rank + parity))
        others = range(parity, 2 * self.world_size, 2)
        reads, deadline, busy = 0, None, 0.0
        while True:
            seen = [words[i] for i in others]
            if all(word >> 32 == tag for word in seen):
                break
            reads += 1
            if self._base:  # sleep in the kernel on the first late process's word: its post wakes this one
                now = time.monotonic()
                busy = busy or now + _BUSY
                if now < busy:
                    continue
                first = next(r for r, word in enumerate(seen) if word >> 32 != tag)
                if seen[first] >> 32 != _LEFT:
                    self._futex.wait(self._tag_address(2 * first + parity), seen[first] >> 32,
                               _SLEEP if deadline is None else max(0.0, min(_SLEEP, deadline - now)))
            if reads <= _SPIN and not self._base:
                os.sched_yield()  # a late process on the same core runs now; on a free core this returns at once
            else:
                now = time.monotonic()
                if any(word >> 32 == _LEFT for word in seen):
                    self._left(seen)
                if deadline is None:
                    deadline = now + self.timeout
                elif now > deadline:
                    missing = [r for r, word in enumerate(seen) if word >> 32 != tag]
                    raise RuntimeError(f"timed out after {self.timeout:g} s waiting for rank(s) {missing} to reach "
                                       f"the same collective (check #{tag}).")
                if not self._base:
                    time.sleep(_NAP)
        signatures = [word & 0xFFFFFFFF for word in seen]
        if len(set(signatures)) != 1:
            # A difference is re-read once: a word is final once its tag is there, so this rules out a torn read.
            time.sleep(1e-3)
            signatures = [words[i] & 0xFFFFFFFF for i in others]
            if len(set(signatures)) != 1:
                return signatures, []
        if not payload:
            return None, [b""] * self.world_size
        return None, [self._payload(rank, tag, len(payload)) for rank in range(self.world_size)]

    def _payload(self, rank: int, tag: int, length: int) -> bytes:
        """`rank`'s payload for check `tag` (the same length as this process's: the signatures agree)."""
        start = self._payloads + (2 * rank + (tag & 1)) * _SLOT
        for _ in range(1000):
            data = self._map[start + 8:start + 8 + length]
            if self._words[start // 8] == (tag << 32) | zlib.crc32(data):
                return data
            time.sleep(0)  # seen before its bytes (a weakly ordered CPU): they are on their way
        raise RuntimeError(f"rank {rank}'s payload for check #{tag} of the host board never became consistent; "
                           "report this as a bug in hasten.")

    def leave(self, reason: int = 0) -> None:
        """Tell the others this process will post no check again (`reason`: an index into `LEFT_REASONS`).

        Example:
            >>> import tempfile
            >>> Board(os.path.join(tempfile.mkdtemp(), "b"), rank=0, world_size=1, timeout=1.0).leave()
        """
        following = (self._number % 0xFFFFFFFE + 1) & 1  # the slot of the next check, which nobody reads yet
        self._words[2 * self.rank + following] = (_LEFT << 32) | (reason << 24) | (os.getpid() & 0xFFFFFF)
        if self._base:
            self._futex.wake(self._tag_address(2 * self.rank + following))  # a process asleep on that word

    def _tag_address(self, index: int) -> int:
        """The address of word `index`'s upper half (its check number; little-endian), the futex slept on."""
        return self._base + 8 * index + 4

    def _left(self, seen: list[int]) -> None:
        import socket

        host = socket.gethostname()
        gone = [f"rank {r} (pid {word & 0xFFFFFF} on {host}) {LEFT_REASONS[min((word >> 24) & 0xFF, 2)]}"
                for r, word in enumerate(seen) if word >> 32 == _LEFT]
        here = watchdog.here()
        mine = (watchdog.describe(self.rank, here) if here is not None
                else f"rank {self.rank} waits in a collective (check #{self._number} of the host board)")
        raise CollectiveDeadlock(f"{' and '.join(gone)} while {mine}, which "
                                 f"{'it' if len(gone) == 1 else 'they'} will never join")

    def close(self) -> None:
        self._words.release()
        self._map.close()


_board: Board | None = None
_board_for: tuple[int, int] | None = None  # (rank, world size) the cached answer is for
_marked = False  # this process posted that it left


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
    from .group import group_timeout

    _board = Board(os.path.join(directory, name), rank, world_size, group_timeout())
    return _board


def mark_left(reason: int = 0) -> None:
    """Post on this machine's board that this process left (see `Board.leave`); nothing without a board.

    Decided from the environment alone, as `board` decides, so it works
    after the script destroyed its process group, or before it used the board.
    The first reason posted stays (the script returning after `end_training`
    still reads "ended its process group").

    Example:
        >>> mark_left()  # not launched with a board: nothing to do
    """
    global _marked
    if _marked:
        return
    _marked = True
    directory = os.environ.get(BOARD_DIR_ENV)
    rank, world_size = os.environ.get("RANK", ""), os.environ.get("WORLD_SIZE", "")
    if not directory or not rank.isdigit() or not world_size.isdigit() or int(world_size) < 2:
        return
    if os.environ.get("LOCAL_WORLD_SIZE") != world_size:
        return  # several machines: no board
    used = _board if _board is not None and _board_for == (int(rank), int(world_size)) else None
    try:
        if used is None:
            name = f"restart-{os.environ.get(RESTART_COUNT_VAR, '0')}.words"
            used = Board(os.path.join(directory, name), int(rank), int(world_size), timeout=0.0)
        used.leave(reason)
    except OSError:  # the launcher removed the directory: the run is over
        pass


# A process that ends its process group (`end_training`, the end of a launched script) posts no check again:
# a process waiting in a checked collective learns it at once, rather than from the watchdog seconds later.
before_leaving(lambda: mark_left(LEFT_REASONS.index("ended its process group")))
