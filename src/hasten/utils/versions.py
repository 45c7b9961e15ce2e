"""The peer's ``accelerate.utils.versions`` path: names only; the code lives in `hasten.core.availability`.

Example:
    >>> from hasten.utils.versions import is_torch_version
    >>> is_torch_version(">=", "2.0")
    True
"""

from ..core.availability import compare_versions, is_torch_version

__all__ = ["compare_versions", "is_torch_version"]
