"""Where each process saves when `save_state` is given a different directory on each process.

Accelerate allows it (its own test scripts save into a `tempfile` directory
made by each process): the main process writes the shared state (models,
optimizers, schedulers, scaler, registered objects) into its directory, and
every process its own state (RNG, data loader positions) into its own. hasten
does the same, and keeps its guarantee per directory: each directory is
staged, checked and renamed into place by one process of those saving into
it (its *committer*, the lowest rank), with a manifest of what it holds —
and none is published unless every process wrote its part.

Example:
    >>> layout = SaveLayout(dirs=["/ckpt/a", "/ckpt/b"], writers=[True, False])
    >>> layout.group(1), layout.is_committer(1), layout.holds_shared(1)
    ([1], True, False)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .commit import CheckpointError

__all__ = ["SaveLayout", "split_layout"]


@dataclass(frozen=True)
class SaveLayout:
    """The directory of each process (by rank) and which processes write the shared files (by rank)."""

    dirs: list[str]
    writers: list[bool]

    def group(self, rank: int) -> list[int]:
        """The processes saving into `rank`'s directory, lowest first.

        Example:
            >>> SaveLayout(dirs=["/a", "/b", "/a"], writers=[True, False, False]).group(2)
            [0, 2]
        """
        return [r for r, directory in enumerate(self.dirs) if directory == self.dirs[rank]]

    def is_committer(self, rank: int) -> bool:
        """Whether `rank` stages, completes and publishes its directory (the lowest rank saving into it).

        Example:
            >>> SaveLayout(dirs=["/a", "/b", "/a"], writers=[True, False, False]).is_committer(2)
            False
        """
        return self.group(rank)[0] == rank

    def holds_shared(self, rank: int) -> bool:
        """Whether `rank`'s directory receives the shared files (a process writing them saves into it).

        Example:
            >>> SaveLayout(dirs=["/a", "/b"], writers=[True, False]).holds_shared(0)
            True
        """
        return any(self.writers[r] for r in self.group(rank))

    def to_json(self) -> dict[str, Any]:
        """A plain value for the handshake's reply (`from_json` reads it back).

        Example:
            >>> SaveLayout.from_json(SaveLayout(dirs=["/a"], writers=[True]).to_json())
            SaveLayout(dirs=['/a'], writers=[True])
        """
        return {"dirs": list(self.dirs), "writers": list(self.writers)}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> "SaveLayout":
        return cls(dirs=list(value["dirs"]), writers=[bool(w) for w in value["writers"]])


def _inside(inner: str, outer: str) -> bool:
    return inner != outer and os.path.commonpath([inner, outer]) == outer


def split_layout(requests: dict[int, dict[str, Any]], every_process: bool, sharded_engine: str | None,
                 async_save: bool) -> SaveLayout:
    """(Main process.) The layout for requests naming different directories, or the one-sentence reason it cannot be.

    `requests`: every process's handshake request by rank (``dir``, absolute,
    or None for automatic naming; ``writer``); `every_process`: whether they all
    called save_state; `sharded_engine`: the engine's name when the state is
    sharded (each process's part is needed in one place), else None.

    Example:
        >>> split_layout({0: {"dir": "/a", "writer": True}, 1: {"dir": "/b", "writer": False}}, True, None, False)
        SaveLayout(dirs=['/a', '/b'], writers=[True, False])
    """
    given = ", ".join(f"process {rank} gave {request['dir'] or 'none (automatic naming)'}"
                      for rank, request in sorted(requests.items()))
    why = None
    dirs = [requests[rank]["dir"] for rank in sorted(requests)]
    if not every_process:
        why = "only some processes called save_state"
    elif any(directory is None for directory in dirs):
        why = "some processes named no directory (automatic naming)"
    elif sharded_engine is not None:
        why = f"{sharded_engine} holds the state in shards, which belong together in one checkpoint"
    elif async_save:
        why = "save_state(async_save=True) publishes one directory"
    elif any(_inside(a, b) for a in dirs for b in dirs):
        why = "one of the directories is inside another"
    if why is not None:
        raise CheckpointError(f"save_state was given different directories ({given}), which hasten saves only when "
                              f"every process names its own directory, but {why}; pass the same output_dir on every "
                              "process.")
    return SaveLayout(dirs=[str(d) for d in dirs], writers=[bool(requests[rank].get("writer")) for rank in sorted(requests)])
