"""How models and optimizers are set up, stepped and saved for the run; chosen once by `select.select_strategy`.

- `base.py`: the seam, `Strategy` (what differs between engines), with its typed parts;
- `select.py`: `select_strategy`, the one place an engine is chosen (with its precision);
- `single.py`: one device;
- one folder per engine, each with its plugin (the user's settings), strategy and checkpoint code:
  `ddp/`, `fsdp/` (FSDP2), `deepspeed/` (ZeRO), `parallel/` (the N-D mesh, tensor and pipeline parallel).

The names below are imported on first use: importing this package (or a plugin module) does not
import torch, so the config reader and the CLI read the plugins' choices without it.

Example:
    >>> from hasten.strategies import Strategy, select_strategy
    >>> Strategy.__name__
    'Strategy'
"""

from __future__ import annotations

from ..core.lazy import lazy_exports

_EXPORTS = {
    "Strategy": "base",
    "SingleDeviceStrategy": "single",
    "DDPStrategy": "ddp.strategy",
    "select_strategy": "select",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


