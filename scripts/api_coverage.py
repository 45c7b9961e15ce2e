"""How much of Accelerate's public API hasten has, at the same import paths and with the same parameter names.

Needs `accelerate` importable (it is NOT a hasten dependency); install it
next to hasten for the check only, e.g. in a virtual environment that sees
the system packages:

    python3 -m venv --system-site-packages /tmp/accel-venv
    /tmp/accel-venv/bin/pip install -c /tmp/torch-constraint.txt accelerate
    /tmp/accel-venv/bin/python scripts/api_coverage.py [--gaps] [--module accelerate.utils.operations]

For each module (`accelerate`, `accelerate.utils` and its submodules, the
top-level modules scripts import from) it lists the public names, looks
each up at the same path under `hasten`, and compares parameter names
(every parameter Accelerate names must exist by name in hasten's
signature; `**kwargs` does not count). `Accelerator`'s public methods and
properties (and its constructor) are checked the same way. It prints
``found / total`` per module and, with `--gaps`, every missing name and
every parameter difference.

Example:
    $ /tmp/accel-venv/bin/python scripts/api_coverage.py
    accelerate                          30/ 40  75.0%
    ...
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
import sys
from dataclasses import dataclass, field
from typing import Any

# Top-level modules whose names scripts import (`from accelerate.data_loader import ...`).
TOP_LEVEL = ["data_loader", "launchers", "state", "local_sgd", "memory_utils", "logging", "optimizer", "scheduler",
             "tracking", "checkpointing", "inference", "parallelism_config", "big_modeling", "hooks"]
@dataclass
class Report:
    module: str
    total: int = 0
    found: int = 0
    missing: list[str] = field(default_factory=list)
    different: list[str] = field(default_factory=list)


def _is_public_value(module_name: str, name: str, value: Any, package_level: bool) -> bool:
    """A public name of `module_name`: defined in Accelerate (re-exports count at package level only)."""
    if name.startswith("_") or inspect.ismodule(value):
        return False
    origin = getattr(value, "__module__", None)
    if callable(value):  # classes, functions, lru_cache-wrapped probes
        if not origin or not origin.startswith("accelerate"):
            return False
        return package_level or origin == module_name
    # constants: UPPER_CASE values, at package level or in the constants module
    return name.isupper() and (package_level or module_name.endswith(".constants"))


def public_names(module_name: str) -> dict[str, Any]:
    module = importlib.import_module(module_name)
    package_level = hasattr(module, "__path__")
    names = getattr(module, "__all__", None) or dir(module)
    return {n: getattr(module, n) for n in names
            if hasattr(module, n) and _is_public_value(module_name, n, getattr(module, n), package_level)}


def _parameters(obj: Any) -> list[str] | None:
    target = obj.__init__ if inspect.isclass(obj) else obj
    if isinstance(target, property) or not callable(target):
        return None
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p.name for p in signature.parameters.values() if p.kind not in kinds and p.name not in ("self", "cls")]


def compare(theirs: Any, ours: Any) -> list[str]:
    """Parameter names Accelerate's callable has that hasten's lacks (empty when compatible or not callable)."""
    if inspect.isclass(theirs) and theirs.__init__ is object.__init__:
        return []
    wanted, have = _parameters(theirs), _parameters(ours)
    if wanted is None or have is None:
        return []
    return [name for name in wanted if name not in have]


def check_module(module_name: str) -> Report:
    ours_name = "hasten" + module_name[len("accelerate"):]
    report = Report(module_name)
    try:
        theirs = public_names(module_name)
    except Exception as err:  # a module that needs an optional dependency of Accelerate's
        report.missing.append(f"(could not import {module_name}: {type(err).__name__})")
        return report
    try:
        ours_module = importlib.import_module(ours_name)
    except ImportError:
        ours_module = None
    for name, value in sorted(theirs.items()):
        report.total += 1
        ours = getattr(ours_module, name, None) if ours_module is not None else None
        if ours is None:
            report.missing.append(f"{ours_name}.{name}")
            continue
        lacking = compare(value, ours)
        if lacking:
            report.different.append(f"{ours_name}.{name}: lacks parameter(s) {', '.join(lacking)}")
        else:
            report.found += 1
    return report


def check_accelerator() -> Report:
    import accelerate
    import hasten

    report = Report("accelerate.Accelerator (methods, properties, constructor)")
    theirs_class, ours_class = accelerate.Accelerator, hasten.Accelerator
    names = ["__init__"] + [n for n in dir(theirs_class) if not n.startswith("_")]
    for name in names:
        report.total += 1
        theirs = inspect.getattr_static(theirs_class, name)
        try:
            ours = inspect.getattr_static(ours_class, name)
        except AttributeError:
            # an attribute set in __init__ (e.g. `state`, `device`) is found on an instance only
            ours = name if name in _instance_attributes() else None
        if ours is None:
            report.missing.append(f"Accelerator.{name}")
            continue
        if isinstance(theirs, (staticmethod, classmethod)):
            theirs = theirs.__func__
        if isinstance(ours, (staticmethod, classmethod)):
            ours = ours.__func__
        lacking = compare(theirs, ours) if callable(theirs) and callable(ours) else []
        if lacking:
            report.different.append(f"Accelerator.{name}: lacks parameter(s) {', '.join(lacking)}")
        else:
            report.found += 1
    return report


_ATTRIBUTES: set[str] | None = None


def _instance_attributes() -> set[str]:
    global _ATTRIBUTES
    if _ATTRIBUTES is None:
        from hasten import Accelerator

        _ATTRIBUTES = set(vars(Accelerator(cpu=True)))
    return _ATTRIBUTES


def modules_to_check() -> list[str]:
    import accelerate.utils

    utils = sorted(f"accelerate.utils.{m.name}" for m in pkgutil.iter_modules(accelerate.utils.__path__))
    return ["accelerate", "accelerate.utils", *utils, *(f"accelerate.{m}" for m in TOP_LEVEL)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gaps", action="store_true", help="list every missing name and parameter difference")
    parser.add_argument("--module", action="append", help="check only this Accelerate module (repeatable)")
    args = parser.parse_args(argv)
    try:
        import accelerate
    except ImportError:
        print("accelerate is not installed; install it for this check only "
              "(see this script's docstring) and run again.", file=sys.stderr)
        return 2
    reports = [check_module(m) for m in (args.module or modules_to_check())]
    if not args.module:
        reports.append(check_accelerator())
    print(f"Accelerate {accelerate.__version__} vs hasten: names at the same path with the same parameter names")
    width = max(len(r.module) for r in reports)
    for r in reports:
        share = f"{100 * r.found / r.total:5.1f}%" if r.total else "    -"
        print(f"{r.module:<{width}}  {r.found:4d}/{r.total:4d}  {share}")
    found, total = sum(r.found for r in reports), sum(r.total for r in reports)
    print(f"{'total':<{width}}  {found:4d}/{total:4d}  {100 * found / max(total, 1):5.1f}%")
    if args.gaps:
        for r in reports:
            if r.missing or r.different:
                print(f"\n## {r.module}")
                for line in r.missing:
                    print(f"  missing   {line}")
                for line in r.different:
                    print(f"  different {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
