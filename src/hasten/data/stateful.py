"""``use_stateful_dataloader=True``: prepared loaders that are torchdata `StatefulDataLoader`s, as Accelerate's are.

Accelerate builds its prepared loader on a torchdata `StatefulDataLoader`
when asked, so libraries check ``isinstance(loader, StatefulDataLoader)``
and call its `state_dict` / `load_state_dict`. hasten does the same with a
class made once per loader class: ``(TorchdataState, <loader class>,
StatefulDataLoader)``. Iteration, sharding and device placement stay the
loader class's; torchdata only reads the batches, and its state is what
the public `state_dict` gives:

- as Accelerate's, the loader takes torchdata's state when it is built,
  which makes the first pass's iterator then (drawing the DataLoader's base
  seed from the random generator, and starting the workers, at `prepare`):
  the random numbers drawn, and so the shuffles, are Accelerate's;
- the state is taken as Accelerate takes it: after a batch was read and
  before the look-ahead batch is, so it stands for "every batch handed out
  so far"; ``_iterator_finished`` says whether the last batch was reached;
- `load_state_dict` hands the state to torchdata, whose next pass
  continues after the saved batch.

hasten's own checkpoints (`save_state` / `load_state`) keep using the
loader's position (`PreparedDataLoader.position_state`), which resumes
exactly; torchdata's state is there for code that asks for it.

Example:
    >>> from hasten.data import PreparedDataLoader
    >>> loader = PreparedDataLoader(list(range(8)), batch_size=2, use_stateful_dataloader=True)
    >>> from torchdata.stateful_dataloader import StatefulDataLoader
    >>> isinstance(loader, StatefulDataLoader), isinstance(loader, PreparedDataLoader)
    (True, True)
"""

from __future__ import annotations

import importlib
from typing import Any


__all__ = ["TorchdataState", "stateful_variant", "torchdata_available"]

_said = False


def torchdata_available() -> bool:
    """Whether torchdata's `StatefulDataLoader` can be used; without it hasten says so once and keeps positions itself.

    Accelerate refuses ``use_stateful_dataloader=True`` without torchdata.
    hasten's checkpoints never needed it (they keep each loader's position
    themselves, and resume exactly), so a run without torchdata goes on; only
    ``isinstance(loader, StatefulDataLoader)`` and torchdata's own state are
    missing then.

    Example:
        >>> isinstance(torchdata_available(), bool)
        True
    """
    global _said
    import importlib.util

    if importlib.util.find_spec("torchdata") is not None:
        return True
    if not _said:
        _said = True
        import os
        import sys

        if os.environ.get("RANK", "0") == "0":  # one line for the run, from the main process
            print("hasten: use_stateful_dataloader=True without torchdata: hasten's checkpoints keep each loader's "
                  "exact position themselves, but the loaders are not torchdata StatefulDataLoaders (pip install "
                  "torchdata for those, as Accelerate needs).", file=sys.stderr, flush=True)
    return False


def _stateful_dataloader_class() -> Any:
    try:  # (imported by name: torchdata ships no type information)
        module = importlib.import_module("torchdata.stateful_dataloader")
    except ImportError:
        raise ImportError("use_stateful_dataloader=True needs torchdata's StatefulDataLoader; install torchdata>=0.8.0 "
                          "(pip install torchdata) or leave use_stateful_dataloader off.") from None
    return module.StatefulDataLoader


class TorchdataState:
    """What a stateful prepared loader adds: torchdata's state, taken where Accelerate's loader takes it.

    Example:
        >>> from hasten.data import PreparedDataLoader
        >>> loader = PreparedDataLoader(list(range(8)), batch_size=2, use_stateful_dataloader=True)
        >>> batches = iter(loader); _ = next(batches); _ = next(batches)
        >>> loader.state_dict()["_num_yielded"]
        2
    """

    use_stateful_dataloader = True
    _state_snapshot: dict[str, Any] | None = None  # the state of the batches handed out so far (None: before any)

    def state_dict(self) -> dict[str, Any]:
        """torchdata's state of this loader: every batch handed out so far counts as read (see the module doc)."""
        if self._state_snapshot is None:  # (unpickled without one)
            self._built()
        return self._state_snapshot  # type: ignore[return-value]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue the next pass after the batches `state_dict` counts (torchdata's `load_state_dict`)."""
        _stateful_dataloader_class().load_state_dict(self, state_dict)
        self._state_snapshot = dict(state_dict) if state_dict else self._state_snapshot

    def _built(self) -> None:
        """Take the first state as Accelerate's loader does when it is built: torchdata makes the first pass's
        iterator for it (drawing its base seed, and with workers starting them), which the first pass then uses."""
        self._state_snapshot = _stateful_dataloader_class().state_dict(self)

    def _early_iterator(self, keep: bool) -> bool:
        """Whether this pass reads with the iterator made at `_built`; when not `keep`, it is dropped."""
        if not getattr(self, "_initial_iter_for_state_dict", False):
            return False
        if keep:
            return True
        self._iterator = None  # (its workers, if any, stop)
        self._initial_iter_for_state_dict = False
        return False

    def _snapshot(self, finished: bool) -> None:
        """Take torchdata's state now (every batch read so far is handed out), marking whether the pass ended."""
        state: dict[str, Any] = _stateful_dataloader_class().state_dict(self)
        state["_iterator_finished"] = finished
        self._state_snapshot = state

    def _skipped(self, iterator: Any, count: int) -> None:
        """`count` batches were skipped without being read: torchdata counts them as read, as if it had read them."""
        if count and getattr(iterator, "_num_workers", 1) == 0 and hasattr(iterator, "_sampler_iter_yielded"):
            iterator._sampler_iter_yielded += count
            iterator._num_yielded += count

    def __reduce_ex__(self, protocol: Any) -> Any:
        # The class is made at run time: pickle names the loader class it was made from instead.
        state = {**self.__dict__, "_iterator": None, "_initial_iter_for_state_dict": False}
        return _rebuild, (_plain_class(type(self)),), state


def _plain_class(cls: type) -> type:
    return cls.__dict__["_made_from"]  # type: ignore[no-any-return]


def _rebuild(made_from: type) -> Any:
    return object.__new__(stateful_variant(made_from))


_VARIANTS: dict[type, type] = {}


def stateful_variant(cls: type) -> type:
    """The class of `cls` loaders that are also torchdata `StatefulDataLoader`s (made once per class).

    Example:
        >>> from hasten.data import PreparedDataLoader
        >>> stateful_variant(PreparedDataLoader) is stateful_variant(PreparedDataLoader)
        True
    """
    if cls not in _VARIANTS:
        base = _stateful_dataloader_class()
        _VARIANTS[cls] = type(cls.__name__, (TorchdataState, cls, base), {
            "__module__": cls.__module__, "__qualname__": cls.__qualname__, "_made_from": cls,
            "__doc__": f"A `{cls.__name__}` that is also a torchdata `StatefulDataLoader` (use_stateful_dataloader=True).",
        })
    return _VARIANTS[cls]
