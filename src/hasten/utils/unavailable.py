"""Names of Accelerate features hasten does not have yet; the code lives in `hasten.core.unavailable`.

Example:
    >>> from hasten.utils.unavailable import MegatronLMPlugin
    >>> MegatronLMPlugin.__name__
    'MegatronLMPlugin'
"""

from ..core.unavailable import *  # noqa: F401,F403 - the refusing stand-ins
from ..core.unavailable import __all__  # noqa: F401
