"""Version comparisons (``accelerate.utils.versions``).

Example:
    >>> from hasten.utils.versions import is_torch_version
    >>> is_torch_version(">=", "2.0")
    True
"""

from __future__ import annotations

import importlib.metadata
import operator

from packaging.version import Version

__all__ = ["compare_versions", "is_torch_version"]

_OPERATIONS = {">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne, "<=": operator.le, "<": operator.lt}


def compare_versions(library_or_version: str | Version, operation: str, requirement_version: str) -> bool:
    """Compare an installed library's version (or a version) with `requirement_version`.

    Example:
        >>> compare_versions("1.2.0", "<", "1.10")
        True
    """
    if operation not in _OPERATIONS:
        raise ValueError(f"operation {operation!r} is not one of {', '.join(_OPERATIONS)}.")
    if isinstance(library_or_version, str):
        try:
            library_or_version = Version(library_or_version)
        except ValueError:
            library_or_version = Version(importlib.metadata.version(library_or_version))
    return _OPERATIONS[operation](library_or_version, Version(requirement_version))


def is_torch_version(operation: str, version: str) -> bool:
    """Compare the installed torch's version (without its local part, e.g. "+cpu") with `version`.

    Example:
        >>> is_torch_version("<", "100.0")
        True
    """
    import torch

    return compare_versions(Version(Version(torch.__version__).base_version), operation, version)
