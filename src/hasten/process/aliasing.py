"""The accelerate switch: every ``import accelerate`` in a process, and in the processes it starts, gets hasten.

Libraries built on Accelerate (transformers' `Trainer`, TRL, PEFT,
diffusers) import it by name. With the switch on they get hasten without a
line of theirs changed, and the real `accelerate` package is never imported
(it need not be installed). Two pieces do it:

- an import finder, first on `sys.meta_path`, that answers
  ``accelerate`` and ``accelerate.X.Y`` with the module object
  ``hasten.X.Y`` itself (hasten keeps Accelerate's module layout, so one
  object serves both names and `isinstance` checks agree), and
- a small directory put first on `sys.path` and on ``PYTHONPATH``, holding
  an ``accelerate`` package that turns the switch on in any process that
  imports it (a launched worker, a data-loader worker, a subprocess) and
  an ``accelerate-1.16.0.dist-info`` so that
  ``importlib.metadata.version("accelerate")`` answers the version of
  Accelerate whose behaviour hasten implements, **1.16.0** (as
  ``accelerate.__version__`` does).

A module served under an accelerate name also carries a patch made on it
(``unittest.mock.patch("accelerate.utils.launch.which")``) to the hasten
module whose code looks the name up: Accelerate's paths are faces that
re-export names defined in hasten's own modules, so setting a name on a face
sets it too on every hasten module that holds the same object under that
name, and putting it back puts those back. A patch thus reaches the code it
targets, as it does in Accelerate, where the code lives in that module.

`import hasten.as_accelerate` turns it on in a script or notebook;
``hasten launch --as-accelerate`` (or ``HASTEN_AS_ACCELERATE=1`` in the
launcher's environment) turns it on in every process of a run.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

from ..core.errors import AccelerateSwitchError
from .launch_spec import AS_ACCELERATE_ENV

__all__ = ["ACCELERATE_VERSION", "SITE_DIRECTORY", "install", "installed", "uninstall", "AccelerateSwitchError"]

ACCELERATE_VERSION = "1.16.0"  # the Accelerate release whose behaviour hasten implements (and reports)
SITE_DIRECTORY = str(Path(__file__).resolve().parent.parent / "_accelerate_site")

# Libraries that decide at import time whether Accelerate is there: imported before the switch, they may not see it.
_CLIENTS = ("transformers", "trl", "peft", "diffusers")



def _ours(module: ModuleType | None) -> bool:
    """A module hasten serves under an accelerate name: hasten's own, or the switch's small package while it loads."""
    if module is None or getattr(module, "__name__", "").startswith("hasten"):
        return True
    return str(getattr(module, "__file__", "") or "").startswith(SITE_DIRECTORY)


def _target(name: str) -> str:
    return "hasten" + name[len("accelerate"):]  # hasten keeps Accelerate's layout: `accelerate.X` is `hasten.X`


_ABSENT = object()
# (id of the served module, name) -> the value the first patch of that name replaced in hasten's modules
_replaced: dict[tuple[int, str], Any] = {}


def _rebind(name: str, current: Any, value: Any, skip: ModuleType) -> None:
    """Set `name` to `value` in every hasten module (but `skip`) where it is bound to `current`."""
    for module_name, module in list(sys.modules.items()):
        if module is skip or not (module_name == "hasten" or module_name.startswith("hasten.")):
            continue
        namespace = getattr(module, "__dict__", None)
        if namespace is not None and namespace.get(name, _ABSENT) is current:
            namespace[name] = value


class _ServedModule(ModuleType):
    """A hasten module served under an accelerate name: setting a name on it also rebinds it where hasten's code reads it.

    Example:
        >>> _ServedModule.__mro__[1] is ModuleType
        True
    """

    def __setattr__(self, name: str, value: Any) -> None:
        # dunders and the import system binding a submodule: nothing to carry over
        if name.startswith("__") or getattr(value, "__name__", None) == f"{self.__name__}.{name}":
            super().__setattr__(name, value)
            return
        before = self.__dict__.get(name, _ABSENT)
        if before is _ABSENT:  # a name the module hands out lazily, or a new one
            before = getattr(self, name, _ABSENT)
        super().__setattr__(name, value)
        if before is _ABSENT or before is value:
            return
        key = (id(self), name)
        if key not in _replaced:
            _replaced[key] = before  # the original, to put back if the patch ends by deleting the name
        elif _replaced[key] is value:
            del _replaced[key]  # the patch is undone
        _rebind(name, before, value, skip=self)

    def __delattr__(self, name: str) -> None:
        current = self.__dict__.get(name, _ABSENT)
        super().__delattr__(name)
        original = _replaced.pop((id(self), name), _ABSENT)
        if current is not _ABSENT and original is not _ABSENT:
            _rebind(name, current, original, skip=self)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``accelerate[.X]`` with the already importable module ``hasten[.X]`` (the same object)."""

    def __init__(self) -> None:
        self._own_specs: dict[int, Any] = {}

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "accelerate" and not fullname.startswith("accelerate."):
            return None
        hasten_name = _target(fullname)
        hasten_spec = importlib.util.find_spec(hasten_name)
        if hasten_spec is None:
            error = ModuleNotFoundError(
                f"{fullname} is not provided by hasten (the accelerate switch serves Accelerate "
                f"{ACCELERATE_VERSION}'s modules from hasten, and this one has no counterpart); "
                "import what you need from the module that has it, or run without the switch.")
            error.name = fullname
            raise error
        # A package where hasten's is one: `python -m accelerate.commands.launch` then runs the module (`get_code`).
        return importlib.machinery.ModuleSpec(fullname, self, origin=hasten_spec.origin,  # runpy's sys.argv[0]
                                              is_package=hasten_spec.submodule_search_locations is not None)

    def get_code(self, fullname: str) -> Any:
        """The code of hasten's module, which runpy runs as ``__main__`` for ``python -m accelerate.X``."""
        spec = importlib.util.find_spec(_target(fullname))
        get_code = getattr(spec.loader, "get_code", None) if spec is not None else None
        return get_code(_target(fullname)) if get_code is not None else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(_target(spec.name))
        self._own_specs[id(module)] = module.__spec__  # the import system overwrites it with the alias's
        if type(module) is ModuleType:
            module.__class__ = _ServedModule  # patches made through the accelerate name reach hasten's code
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._own_specs.pop(id(module), module.__spec__)


_finder: _Finder | None = None


def installed() -> bool:
    """Whether the accelerate switch is on in this process.

    Example:
        >>> installed()  # on only after `import hasten.as_accelerate` (or in a process launched with it)
        False
    """
    return _finder is not None


def install() -> None:
    """Turn the accelerate switch on in this process and in every process it starts; does nothing if on.

    Raises `AccelerateSwitchError` when the real ``accelerate`` was
    imported already (two copies of Accelerate's state cannot agree), and
    warns when transformers, TRL, PEFT or diffusers were imported first.

    Example:
        >>> install()  # doctest: +SKIP
        >>> import accelerate, hasten
        >>> accelerate is hasten  # doctest: +SKIP
        True
    """
    global _finder
    if _finder is not None:
        return
    hasten_module = sys.modules["hasten"]
    real = sorted(name for name, module in list(sys.modules.items())
                  if (name == "accelerate" or name.startswith("accelerate.")) and not _ours(module))
    if real:
        raise AccelerateSwitchError(
            f"the real accelerate package was imported before the switch ({real[0]}); put "
            "`import hasten.as_accelerate` first in the script, before any import of accelerate or a library using it.")
    early = [name for name in _CLIENTS if name in sys.modules]
    if early:
        warnings.warn(f"{', '.join(early)} imported before hasten's accelerate switch and may not see Accelerate; "
                      "put `import hasten.as_accelerate` before it.", stacklevel=3)
    _finder = _Finder()
    sys.meta_path.insert(0, _finder)
    if SITE_DIRECTORY not in sys.path:
        sys.path.insert(0, SITE_DIRECTORY)  # importlib.metadata finds the dist-info here first
    entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != SITE_DIRECTORY]
    os.environ["PYTHONPATH"] = os.pathsep.join([SITE_DIRECTORY, *entries])
    os.environ[AS_ACCELERATE_ENV] = "1"
    sys.modules.setdefault("accelerate", hasten_module)
    importlib.invalidate_caches()
    _forget_cached_absence(early)


def _forget_cached_absence(libraries: list[str]) -> None:
    """Clear a library's cached "is Accelerate available" answer, computed before the switch (transformers caches it)."""
    for name in libraries:
        module = sys.modules.get(f"{name}.utils.import_utils")
        check = getattr(module, "is_accelerate_available", None)
        if check is not None and hasattr(check, "cache_clear"):
            check.cache_clear()


def uninstall() -> None:
    """Turn the switch off in this process (tests use it); modules already imported keep what they imported.

    Example:
        >>> uninstall()  # nothing to do when the switch is off
        >>> installed()
        False
    """
    global _finder
    if _finder is None:
        return
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    _finder = None
    while SITE_DIRECTORY in sys.path:
        sys.path.remove(SITE_DIRECTORY)
    entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != SITE_DIRECTORY]
    if entries:
        os.environ["PYTHONPATH"] = os.pathsep.join(entries)
    else:
        os.environ.pop("PYTHONPATH", None)
    os.environ.pop(AS_ACCELERATE_ENV, None)
    for name in [n for n in sys.modules if n == "accelerate" or n.startswith("accelerate.")]:
        del sys.modules[name]
    importlib.invalidate_caches()
