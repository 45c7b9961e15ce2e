"""How much of Accelerate's public API hasten has, at the same import paths and with the same parameter names.

Needs `accelerate` importable at the release hasten implements, 1.16.0 (it is
NOT a hasten dependency; the test extra pins it); install it next to hasten
for the check only, e.g. in a virtual environment that sees the system
packages (the exit status is 1 while a name or flag is missing, 2 with
another release installed):

    python3 -m venv --system-site-packages /tmp/accel-venv
    /tmp/accel-venv/bin/pip install -c /tmp/torch-constraint.txt accelerate==1.16.0
    /tmp/accel-venv/bin/python scripts/api_coverage.py [--gaps] [--module accelerate.utils.operations]

For each module (`accelerate`, `accelerate.utils` and its submodules, the
top-level modules scripts import from) it lists the public names, looks
each up at the same path under `hasten`, and compares parameter names
(every parameter Accelerate names must exist by name in hasten's
signature; `**kwargs` does not count). `Accelerator`'s public methods and
properties (and its constructor) are checked the same way. It prints
``found / total`` per module and, with `--gaps`, every missing name and
every parameter difference.

It also compares the launch command's flags with `accelerate launch`'s:
Accelerate's real parser (`accelerate.commands.launch.launch_command_parser`
of the installed package, read in a subprocess without the accelerate
switch) against `hasten launch`'s; every option string Accelerate accepts
must be accepted, with the same destination and default (`--launch-flags`
prints only this line, and with `--gaps` each difference).

With `--corpus PATH[:SUBDIR]` (repeatable) it instead checks real scripts:
every name they use from Accelerate (``from accelerate.x import y``,
``accelerate.x.y`` after ``import accelerate``, attributes of imported
classes such as ``DistributedType.XLA``, and ``accelerator.<attribute>`` /
``accelerator.state.<attribute>`` on an object built by ``Accelerator(...)``)
must exist at the same path in hasten. PATH is a directory or a git
directory (its HEAD is read; SUBDIR limits the files, e.g. ``examples``).
This mode needs only hasten; with `accelerate` importable, names that
Accelerate itself lacks are reported apart and not counted.

Example:
    $ /tmp/accel-venv/bin/python scripts/api_coverage.py
    accelerate                          30/ 40  75.0%
    ...
    $ python3 scripts/api_coverage.py --corpus /path/to/diffusers/.git:examples
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import pkgutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

# The Accelerate release hasten implements: the comparison is with it (pip install accelerate==1.16.0).
REFERENCE_VERSION = "1.16.0"
# Top-level modules whose names scripts import (`from accelerate.data_loader import ...`).
TOP_LEVEL = ["data_loader", "launchers", "state", "local_sgd", "memory_utils", "logging", "optimizer", "scheduler",
             "tracking", "checkpointing", "parallelism_config", "big_modeling", "hooks"]
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


# -- the --corpus mode: names real scripts use ----------------------------------------------------------------


def corpus_files(spec: str) -> dict[str, str]:
    """{path: source} of the .py files under `spec` = PATH[:SUBDIR] (a directory, or a git directory's HEAD)."""
    path, _, sub = spec.partition(":")
    root = Path(path)
    if (root / "HEAD").is_file() and (root / "objects").is_dir():  # a git directory
        git = ["git", "--git-dir", str(root)]
        names = subprocess.run([*git, "ls-tree", "-r", "--name-only", "HEAD", *([sub] if sub else [])], check=True,
                               capture_output=True, text=True).stdout.split()
        return {n: subprocess.run([*git, "show", f"HEAD:{n}"], check=True, capture_output=True, text=True).stdout
                for n in names if n.endswith(".py")}
    base = root / sub if sub else root
    return {str(p.relative_to(root)): p.read_text(errors="replace") for p in sorted(base.rglob("*.py"))}


def _dotted(node: ast.AST) -> list[str] | None:
    """`a.b.c` as ["a", "b", "c"] (None for anything else)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def used_names(source: str) -> set[str]:
    """Dotted Accelerate paths a script uses, e.g. "accelerate.utils.set_seed", "accelerate.Accelerator.prepare"."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    _mark_parents(tree)  # an attribute chain is counted once, at its outermost node
    bound: dict[str, str] = {}  # local name -> accelerate path
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == "accelerate" or node.module.startswith("accelerate.")):
            for alias in node.names:
                path = f"{node.module}.{alias.name}"
                used.add(path)
                bound[alias.asname or alias.name] = path
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "accelerate" or alias.name.startswith("accelerate."):
                    used.add(alias.name)
                    bound[alias.asname or alias.name.split(".")[0]] = alias.asname and alias.name or "accelerate"
    accelerators = {"accelerator"}  # variables holding an Accelerator(...)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            callee = _dotted(node.value.func)
            if callee and bound.get(callee[0], "").endswith(".Accelerator") and len(callee) == 1:
                accelerators.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or isinstance(getattr(node, "_parent", None), ast.Attribute):
            continue
        if isinstance(node.ctx, ast.Store):  # `accelerator.native_amp = False` sets, it does not need the name
            continue
        chain = _dotted(node)
        if not chain:
            continue
        if chain[0] in bound:
            used.add(".".join([bound[chain[0]], *chain[1:]]))
        elif chain[0] in accelerators or (chain[0] == "self" and len(chain) > 1 and chain[1] == "accelerator"):
            rest = chain[1:] if chain[0] != "self" else chain[2:]
            if rest:
                used.add(".".join(["accelerate.Accelerator", *rest[:2 if rest[0] == "state" else 1]]))
    return used


def _mark_parents(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child._parent = node  # type: ignore[attr-defined]


_ACCELERATOR_INSTANCE: dict[str, Any] = {}


def resolve(path: str, root: str) -> bool:
    """Does `path` (an accelerate path) exist under `root` ("hasten" or "accelerate")?"""
    parts = path.split(".")
    parts[0] = root
    if parts[1:2] == ["Accelerator"] and len(parts) > 2:  # attributes of an Accelerator (set in __init__ too)
        return _accelerator_has(root, parts[2:])
    obj: Any = None
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        if obj is not None and hasattr(obj, parts[i - 1]):
            obj = getattr(obj, parts[i - 1])
            continue
        try:
            obj = importlib.import_module(name)
        except ImportError:
            return False
    return True


def _accelerator_has(root: str, attributes: list[str]) -> bool:
    if root not in _ACCELERATOR_INSTANCE:
        module = importlib.import_module(root)
        _ACCELERATOR_INSTANCE[root] = module.Accelerator(cpu=True)
    obj = _ACCELERATOR_INSTANCE[root]
    for attribute in attributes:
        try:
            obj = getattr(obj, attribute)
        except AttributeError:
            return False
        except Exception:  # noqa: BLE001 - a property that needs a prepared object still exists
            return True
    return True


def corpus_report(specs: list[str], gaps: bool = False) -> int:
    """Print, per corpus, how many files use only names hasten has, and the missing names."""
    try:
        importlib.import_module("accelerate")
        peer = True
    except ImportError:
        peer = False
    for spec in specs:
        files = corpus_files(spec)
        users: dict[str, set[str]] = defaultdict(set)  # path used -> files
        using = 0
        for name, source in files.items():
            names = used_names(source)
            using += bool(names)
            for path in names:
                users[path].add(name)
        missing = {p: f for p, f in users.items() if not resolve(p, "hasten")}
        not_in_peer = {p for p in missing if peer and not resolve(p, "accelerate")}
        counted = {p: f for p, f in missing.items() if p not in not_in_peer}
        bad_files = set().union(*counted.values()) if counted else set()
        print(f"{spec}: {len(files)} .py files, {using} use Accelerate; {using - len(bad_files)}/{using} use only "
              f"names hasten has; names used {len(users) - len(not_in_peer)}, found {len(users) - len(missing)}")
        if gaps or counted:
            for path, where in sorted(counted.items()):
                print(f"  missing  hasten{path[len('accelerate'):]}  ({len(where)} file(s), e.g. {sorted(where)[0]})")
        if not_in_peer:
            print(f"  ({len(not_in_peer)} name(s) that Accelerate {importlib.import_module('accelerate').__version__} "
                  f"lacks too, not counted: {', '.join(sorted(not_in_peer)[:8])}{' ...' if len(not_in_peer) > 8 else ''})")
    return 0


# Defaults of `accelerate launch` that `hasten launch` does not share, and why (docs/cli.md says so too).
LAUNCH_DEFAULTS_THAT_DIFFER = {
    "fsdp_version": "unset is FSDP2, the engine hasten runs (Accelerate's launcher says 1)",
}
_OPTIONS_PROGRAM = """
import json, sys
from {module} import {function} as make
parser = make()
print(json.dumps({{name: {{"dest": a.dest, "default": repr(a.default), "takes_value": a.nargs != 0}}
                  for a in parser._actions for name in a.option_strings}}))
"""


def _launch_options(python: str, module: str, function: str, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    import json

    done = subprocess.run([python, "-c", _OPTIONS_PROGRAM.format(module=module, function=function)],
                          capture_output=True, text=True, env=env, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"reading {module}.{function} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def compare_launch_flags(python: str = sys.executable) -> tuple[int, int, list[str]]:
    """(present, total, problems): Accelerate's `accelerate launch` options against `hasten launch`'s.

    Accelerate's parser is read in a subprocess whose environment has no
    accelerate switch (so `accelerate` is the installed package); hasten's
    is `hasten launch`'s own sub-parser. An option counts as present when
    hasten accepts the same string, stores it in the same destination and,
    unless `LAUNCH_DEFAULTS_THAT_DIFFER` says why not, with the same default.
    """
    import os

    env = {k: v for k, v in os.environ.items() if k != "HASTEN_AS_ACCELERATE"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                        if p and "_accelerate_site" not in p)
    theirs = _launch_options(python, "accelerate.commands.launch", "launch_command_parser", env)
    ours = _launch_options(python, "hasten.cli.launch", "launch_parser", env)
    problems = []
    for name, action in sorted(theirs.items()):
        mine = ours.get(name)
        if mine is None:
            problems.append(f"{name}: not accepted")
        elif mine["dest"] != action["dest"] or mine["takes_value"] != action["takes_value"]:
            problems.append(f"{name}: stored in {mine['dest']!r} (Accelerate: {action['dest']!r})")
        elif mine["default"] != action["default"] and action["dest"] not in LAUNCH_DEFAULTS_THAT_DIFFER:
            problems.append(f"{name}: default {mine['default']} (Accelerate: {action['default']})")
    return len(theirs) - len(problems), len(theirs), problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gaps", action="store_true", help="list every missing name and parameter difference")
    parser.add_argument("--module", action="append", help="check only this Accelerate module (repeatable)")
    parser.add_argument("--corpus", action="append", metavar="PATH[:SUBDIR]",
                        help="check the names these scripts use instead (a directory or git directory; repeatable)")
    parser.add_argument("--launch-flags", action="store_true", help="compare only the launch command's flags")
    args = parser.parse_args(argv)
    if args.corpus:
        return corpus_report(args.corpus, gaps=args.gaps)
    try:
        import accelerate
    except ImportError:
        print("accelerate is not installed; install it for this check only "
              "(see this script's docstring) and run again.", file=sys.stderr)
        return 2
    if accelerate.__version__ != REFERENCE_VERSION:
        print(f"hasten implements Accelerate {REFERENCE_VERSION}, but accelerate {accelerate.__version__} is installed; "
              f"compare with the release it implements: pip install accelerate=={REFERENCE_VERSION}.", file=sys.stderr)
        return 2
    present, total, problems = compare_launch_flags()
    launch_line = f"accelerate launch flags (hasten launch)  {present:4d}/{total:4d}  {100 * present / max(total, 1):5.1f}%"
    if args.launch_flags:
        print(launch_line)
        for line in problems if args.gaps else ():
            print(f"  {line}")
        return 0 if not problems else 1
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
    print(launch_line)
    if args.gaps:
        if problems:
            print("\n## accelerate launch flags")
            for line in problems:
                print(f"  {line}")
        for r in reports:
            if r.missing or r.different:
                print(f"\n## {r.module}")
                for line in r.missing:
                    print(f"  missing   {line}")
                for line in r.different:
                    print(f"  different {line}")
    return 0 if found == total and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
