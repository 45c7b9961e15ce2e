"""``import hasten.as_accelerate``: from here on, every ``import accelerate`` gets hasten, in this process and its children.

Put it first in a script or notebook that uses a library built on
Accelerate (transformers' `Trainer`, TRL, PEFT, diffusers); no line of
the library changes. ``hasten launch --as-accelerate train.py`` does the
same for every process of a run. How it works: `hasten.process.aliasing`.

Example:
    >>> import hasten.as_accelerate  # doctest: +SKIP
    >>> import accelerate  # doctest: +SKIP
    >>> accelerate.__version__, accelerate.Accelerator.__module__  # doctest: +SKIP
    ('1.16.0', 'hasten.accelerator')
"""

from .process.aliasing import install as _install

_install()
