"""`notebook_launcher`, `debug_launcher` and `test_launch` under the peer's path (``accelerate.launchers``).

Example:
    >>> from hasten.launchers import debug_launcher, notebook_launcher
"""

from .launch.notebook import debug_launcher, notebook_launcher, test_launch

__all__ = ["debug_launcher", "notebook_launcher", "test_launch"]
