"""TCP ports on this machine: is one in use, which one is free (the peer's path: ``accelerate.utils.other``).

hasten's launcher has its own checks (`hasten.launch.plan`), which bind the port as torchrun will.

Example:
    >>> from hasten.process.ports import get_free_port, is_port_in_use
    >>> 0 < get_free_port() < 65536
    True
"""

from __future__ import annotations

import socket

__all__ = ["get_free_port", "is_port_in_use"]


def is_port_in_use(port: int | None = None) -> bool:
    """True when something listens on localhost:`port` (default 29500).

    Example:
        >>> isinstance(is_port_in_use(get_free_port()), bool)
        True
    """
    port = 29500 if port is None else port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        return probe.connect_ex(("localhost", port)) == 0


def get_free_port() -> int:
    """A TCP port free on this machine right now.

    Example:
        >>> 0 < get_free_port() < 65536
        True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]
