"""Rich tracebacks, as importing Accelerate's ``accelerate.utils.rich`` installs them (the peer's path is that module).

Importing this module installs rich's traceback handler when rich is
installed and asked for (``ACCELERATE_ENABLE_RICH=1``, `is_rich_available`);
otherwise the import fails with `ModuleNotFoundError`, as Accelerate's does.
``import hasten`` (and ``import accelerate`` under the switch) imports it when
rich is asked for.

Example:
    >>> import importlib
    >>> try:
    ...     _ = importlib.import_module("hasten.core.rich_traceback")
    ... except ModuleNotFoundError as error:
    ...     print(str(error).startswith("To use the rich extension"))
    True
"""

from __future__ import annotations

from .availability import is_rich_available

if is_rich_available():
    from rich.traceback import install

    install(show_locals=False)
else:
    raise ModuleNotFoundError("To use the rich extension, install rich with `pip install rich` and set "
                              "ACCELERATE_ENABLE_RICH=1.")
