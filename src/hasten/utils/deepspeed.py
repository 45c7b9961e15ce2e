"""DeepSpeed names under the peer's import path (``accelerate.utils.deepspeed``); they live in `hasten.deepspeed_plugin`.

Example:
    >>> from hasten.utils.deepspeed import DeepSpeedPlugin
    >>> DeepSpeedPlugin(zero_stage=3).zero_stage
    3
"""

from __future__ import annotations

import importlib

_NAMES = ("DeepSpeedPlugin", "DummyOptim", "DummyScheduler", "HfDeepSpeedConfig", "DeepSpeedConfigError", "require_deepspeed")
__all__ = list(_NAMES)


def __getattr__(name: str) -> object:
    if name not in _NAMES:
        raise AttributeError(f"module 'hasten.utils.deepspeed' has no attribute {name!r}")
    return getattr(importlib.import_module("hasten.deepspeed_plugin"), name)
