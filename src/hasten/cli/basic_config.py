"""`write_basic_config`: `hasten config default` as a function (the peer's path: ``accelerate.utils.other``).

Example:
    >>> from hasten.cli.basic_config import write_basic_config
    >>> write_basic_config  # doctest: +ELLIPSIS
    <function write_basic_config at ...>
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_basic_config"]


def write_basic_config(mixed_precision: str = "no", save_location: str | os.PathLike[str] | None = None) -> Path | bool:
    """Write a default launch config (one process per GPU, else one process) unless the file exists.

    `save_location` defaults to hasten's config path (`hasten config`'s).
    Returns the path written, or False when a file is already there.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "config.yaml"
        >>> write_basic_config("no", path) == path
        True
        >>> write_basic_config("no", path)  # doctest: +ELLIPSIS
        Configuration already exists at ..., will not override. ...
        False
    """
    from .config_command import default_config, detect_hardware
    from ..launch.config import default_config_path, save_config
    from ..process.launch_spec import MIXED_PRECISION_CHOICES

    if mixed_precision not in MIXED_PRECISION_CHOICES:
        raise ValueError(f"mixed_precision={mixed_precision!r} is not one of {', '.join(MIXED_PRECISION_CHOICES)}.")
    path = Path(save_location) if save_location is not None else default_config_path()
    if path.exists():
        print(f"Configuration already exists at {path}, will not override. Run `hasten config` manually or pass a "
              "different save_location.")
        return False
    gpus, _ = detect_hardware()
    return save_config(default_config(gpus, mixed_precision), path)
