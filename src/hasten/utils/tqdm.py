"""The peer's ``accelerate.utils.tqdm`` path; the code lives in `hasten.runtime.progress`.

Example:
    >>> from hasten.utils.tqdm import tqdm
    >>> sum(tqdm(range(3), disable=True))
    3
"""

from ..runtime.progress import tqdm

__all__ = ["tqdm"]
