"""The snapshot an asynchronous `save_state` writes: taken at the call, its large tensors copied on the writer thread.

A deep copy of the state as of the `save_state(async_save=True)` call, in
two halves. On the training thread, `take()` deep-copies every value
(`copy.deepcopy`: the same structure, aliasing and bytes a synchronous save
writes) except the storages of the large model parameters and optimizer
state tensors, for which it hands `copy.deepcopy` empty buffers of the same
size (through its storage memo) instead of cloning them. On the writer
thread, `finish()` fills those buffers with `copy_` before anything is
written. Only the optimizer step changes those tensors, so every
optimizer's step first waits for `finish()` (a global step pre-hook); what
changes anything else — the next forward (buffers), backward (gradients),
the scheduler, the loaders — is copied at the call.

What is guaranteed: the files hold the state as of the `save_state` call,
provided the parameters and the optimizer state change only through an
optimizer's `step()` (or after `handle.wait()`). An in-place change made
another way before the copy (``param.add_(...)`` under ``no_grad``,
``load_state_dict``) is detected from the tensors' version counters: the
save then fails (`wait()` raises) rather than write a mixed state; one made
through ``param.data`` escapes the version counter and is not detected.
`load_state`, the next save, a preemption save and the end of the run wait
for the whole save.

The CPU buffers of the last snapshot are kept and reused by the next one
(same sizes: no new allocation, no page faults); buffers on an accelerator
are freed once written.

Example:
    >>> import torch
    >>> weights = torch.zeros(1 << 16)
    >>> snapshot = Snapshot([weights])
    >>> copied = snapshot.take({"w": weights})
    >>> snapshot.arm()
    >>> _ = weights.add_(1)  # changed before the copy: detected, not written
    >>> snapshot.finish()
    Traceback (most recent call last):
    ...
    hasten.core.errors.CheckpointError: save_state(async_save=True) found 1 parameter or optimizer-state tensor (shape (65536,)) changed in place before it was copied; change them only through the optimizer's step(), or call handle.wait() first.
"""

from __future__ import annotations

import copy
import threading
from typing import Any, Iterable

import torch

from .commit import CheckpointError

__all__ = ["Snapshot", "wait_for_copy", "DEFERRED_BYTES"]

#: Storages at least this large are copied on the writer thread; smaller ones at the call (cheaper than deferring).
DEFERRED_BYTES = 64 * 1024

_copying: Snapshot | None = None  # the snapshot whose deferred storages are not copied yet
_pool: dict[int, list[torch.UntypedStorage]] = {}  # the last snapshot's CPU buffers by size, for the next one
_hooked = False


def _deferrable(tensor: torch.Tensor) -> bool:
    """A plain dense tensor that `copy.deepcopy` copies storage by storage (so its memo is used), large enough."""
    return (type(tensor) in (torch.Tensor, torch.nn.Parameter) and tensor.layout == torch.strided
            and not tensor.is_quantized and tensor.device.type in ("cpu", "cuda")
            and tensor.untyped_storage().nbytes() >= DEFERRED_BYTES)


def _buffer(nbytes: int, device: torch.device) -> torch.UntypedStorage:
    if device.type == "cpu" and _pool.get(nbytes):
        return _pool[nbytes].pop()
    return torch.UntypedStorage(nbytes, device=device)


class Snapshot:
    """A deep copy of the values to save whose large `guarded` tensors (parameters, optimizer state) `finish()` copies.

    `take(value)` copies `value` now but for the guarded storages; `arm()`
    makes every optimizer step wait for `finish()`, which copies them and
    checks that nothing changed them in the meantime. See the module doc.
    """

    def __init__(self, guarded: Iterable[torch.Tensor]) -> None:
        self._memo: dict[Any, Any] = {"torch": {}}  # copy.deepcopy's memo: its storage copies, keyed by storage
        self._copies: list[tuple[torch.UntypedStorage, torch.UntypedStorage]] = []  # (buffer, live storage)
        self._versions: list[tuple[torch.Tensor, int]] = []
        self.copied = threading.Event()
        storages: dict[int, Any] = self._memo["torch"]
        for tensor in guarded:
            if not _deferrable(tensor):
                continue
            live = tensor.untyped_storage()
            self._versions.append((tensor, tensor._version))
            if live._cdata not in storages:  # tied weights and other views share one storage: one copy
                storages[live._cdata] = buffer = _buffer(live.nbytes(), tensor.device)
                self._copies.append((buffer, live))

    def take(self, value: Any) -> Any:
        """A deep copy of `value` (whose guarded storages are filled by `finish()`)."""
        return copy.deepcopy(value, self._memo)

    def arm(self) -> None:
        """From now on every optimizer step waits until the guarded tensors are copied."""
        global _copying, _hooked
        if not _hooked:
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: wait_for_copy())
            _hooked = True
        _copying = self

    def finish(self) -> None:
        """(Writer thread.) Copy the guarded storages, then let the optimizers step; raise if one changed meanwhile."""
        try:
            for buffer, live in self._copies:
                buffer.copy_(live)
            if any(buffer.device.type == "cuda" for buffer, _ in self._copies):
                torch.cuda.synchronize()
            changed = [tensor for tensor, version in self._versions if tensor._version != version]
        finally:
            self._disarm()
        if changed:
            raise CheckpointError(
                f"save_state(async_save=True) found {len(changed)} parameter or optimizer-state tensor"
                f"{'s' if len(changed) > 1 else ''} (shape {tuple(changed[0].shape)}) changed in place before it was "
                "copied; change them only through the optimizer's step(), or call handle.wait() first.")

    def _disarm(self) -> None:
        global _copying
        if _copying is self:
            _copying = None
        self.copied.set()

    def release(self) -> None:
        """(Once written, or failed.) No step waits any more; keep the CPU buffers for the next snapshot, drop the rest."""
        self._disarm()
        _pool.clear()
        for buffer, _ in self._copies:
            if buffer.device.type == "cpu":
                _pool.setdefault(buffer.nbytes(), []).append(buffer)
        self._copies.clear()
        self._memo.clear()


def wait_for_copy() -> None:
    """Block until the pending snapshot's guarded tensors are copied (an optimizer step may then change them)."""
    snapshot = _copying
    if snapshot is not None:
        snapshot.copied.wait()
