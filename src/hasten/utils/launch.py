"""The peer's ``accelerate.utils.launch`` path: `PrepareForLaunch`; the code lives in `hasten.launch.forked`.

Example:
    >>> from hasten.utils.launch import PrepareForLaunch
    >>> PrepareForLaunch.__name__
    'PrepareForLaunch'
"""

from ..launch.forked import PrepareForLaunch

__all__ = ["PrepareForLaunch"]
