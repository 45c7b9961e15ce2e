"""`notebook_launcher` and `debug_launcher` under the peer's path (``accelerate.launchers``).

Example:
    >>> from hasten.launchers import debug_launcher, notebook_launcher
"""

from .launch.notebook import debug_launcher, notebook_launcher

__all__ = ["debug_launcher", "notebook_launcher"]
