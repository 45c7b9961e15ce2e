"""The peer's ``accelerate.utils.random`` path: names only; the code lives in `hasten.runtime.seeding`.

Example:
    >>> from hasten.utils.random import set_seed, synchronize_rng_states
    >>> set_seed(0)
    >>> synchronize_rng_states(["torch"])  # one process: nothing to do
"""

from ..runtime.seeding import set_seed, synchronize_rng_state, synchronize_rng_states

__all__ = ["set_seed", "synchronize_rng_state", "synchronize_rng_states"]
