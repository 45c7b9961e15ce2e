"""Weights offloaded to disk, at the peer's path (``accelerate.utils.offload``); the code is in `hasten.big_modeling.offload`.

Example:
    >>> import tempfile, torch
    >>> from hasten.utils.offload import offload_weight, load_offloaded_weight
    >>> folder = tempfile.mkdtemp()
    >>> index = offload_weight(torch.arange(3.0), "w", folder, index={})
    >>> load_offloaded_weight(f"{folder}/w.dat", index["w"])
    tensor([0., 1., 2.])
"""

from ..big_modeling.offload import *  # noqa: F401,F403
from ..big_modeling.offload import __all__  # noqa: F401
