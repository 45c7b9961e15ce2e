"""Facts about the machine a process runs on that can make a run misbehave (the peer's path: ``accelerate.utils.other``).

Example:
    >>> from hasten.runtime.host import check_os_kernel
    >>> check_os_kernel()  # warns, on the main process, only on a Linux kernel older than 5.5
"""

from __future__ import annotations

import platform
import re

from ..logging import get_logger

__all__ = ["MIN_LINUX_KERNEL", "check_os_kernel"]

# Older Linux kernels can leave processes hanging in collectives (Accelerate's issue #1929); Accelerate warns below it.
MIN_LINUX_KERNEL = "5.5.0"

_logger = get_logger(__name__)


def check_os_kernel() -> None:
    """Warn (main process only) when this Linux kernel is older than 5.5.0; nothing on other systems.

    Accelerate's `Accelerator` makes this check when it starts.

    Example:
        >>> check_os_kernel()
    """
    info = platform.uname()
    if info.system != "Linux":
        return
    found = re.search(r"\d+\.\d+\.\d+", info.release)
    if found is None:  # a release string without x.y.z says nothing about the version
        return
    version = found.group(0)
    from packaging.version import Version

    if Version(version) < Version(MIN_LINUX_KERNEL):
        # the message is formatted here so that handlers reading `record.msg` see the versions
        _logger.warning(f"Detected kernel version {version}, which is below the recommended minimum of "
                        f"{MIN_LINUX_KERNEL}; processes can hang in collectives on it. Upgrade the kernel to "
                        f"{MIN_LINUX_KERNEL} or newer.", main_process_only=True)
