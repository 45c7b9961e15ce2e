"""A pytest plugin for `scripts/peer_suite.py`'s runs of Accelerate 1.15's engine folders (`fsdp/`, `deepspeed/`, `tp/`).

Those test files import Accelerate 1.15's own test helpers (`accelerate.test_utils` of the 1.15.0 wheel: 1.16's
lack `require_fsdp2`), and 1.15's helpers import one name that Accelerate 1.16 removed and hasten, being 1.16,
does not have: `accelerate.utils.is_pippy_available`. This plugin gives the helpers that name, as hasten 1.15
answered it (False: there is no PiPPy package behind `accelerate.inference`, which 1.16 removed), in these test
processes only; hasten itself stays 1.16.
"""

from __future__ import annotations

import os


def pytest_configure(config) -> None:  # type: ignore[no-untyped-def]
    if os.environ.get("PEER_LIB") != "hasten":
        return
    import hasten.utils

    if not hasattr(hasten.utils, "is_pippy_available"):
        hasten.utils.is_pippy_available = lambda: False  # type: ignore[attr-defined]
