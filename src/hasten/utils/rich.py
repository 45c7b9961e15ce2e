"""The peer's ``accelerate.utils.rich`` path: importing it installs rich tracebacks (see `hasten.core.rich_traceback`).

Example:
    >>> import importlib  # without rich asked for (ACCELERATE_ENABLE_RICH=1) the import fails, as Accelerate's does
"""

from ..core import rich_traceback  # noqa: F401  (installs the handler, or raises ModuleNotFoundError)
