"""A progress bar shown by one process per machine (the peer's path: ``accelerate.utils.tqdm``).

Example:
    >>> from hasten.runtime.progress import tqdm
    >>> sum(tqdm(range(3), disable=True))
    3
"""

from __future__ import annotations

from typing import Any

__all__ = ["tqdm"]


def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
    """`tqdm.auto.tqdm(*args, **kwargs)`, disabled on every process but each machine's local main one.

    `main_process_only=False` shows the bar on every process; an explicit
    `disable=True` always hides it.

    Example:
        >>> from hasten.utils import tqdm
        >>> bar = tqdm(total=2, disable=True); bar.update(2); bar.close()
    """
    if args and isinstance(args[0], bool):
        raise ValueError("tqdm's first argument is the iterable, not a bool; pass main_process_only=True/False "
                         "as a keyword instead.")
    try:
        from tqdm.auto import tqdm as progress_bar
    except ImportError:
        raise ImportError("hasten.utils.tqdm needs the tqdm package, which is not installed; pip install tqdm.") from None
    disable = kwargs.pop("disable", False)
    if main_process_only and not disable:
        from .state import PartialState

        disable = PartialState().local_process_index != 0
    return progress_bar(*args, disable=disable, **kwargs)  # type: ignore[call-overload]  # stubs want the iterable first; tqdm also takes total= alone
