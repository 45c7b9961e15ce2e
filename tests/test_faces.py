"""Accelerate's import paths are faces: they only re-export names defined once in hasten's own modules.

A face may hold a docstring, imports, `__all__`, plain aliases (`DataLoaderShard = PreparedDataLoader`) and,
as Accelerate's command modules end, ``if __name__ == "__main__": main()`` (``python -m accelerate.commands.X``);
a `def`, a `class`, any other statement, or an assignment that computes something is code that belongs in
hasten's layers, and fails here with the face and the line.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "hasten"

# Accelerate's module paths that hasten keeps only as faces (hasten's own packages such as
# hasten.big_modeling, hasten.checkpointing or hasten.local_sgd are the code itself, not faces;
# state, optimizer and scheduler live in hasten.runtime).
FACES = sorted(
    [f"utils/{path.name}" for path in (SRC / "utils").glob("*.py")]
    + [str(path.relative_to(SRC)) for path in (SRC / "commands").rglob("*.py")]
    + ["data_loader.py", "launchers.py", "memory_utils.py", "hooks.py", "parallelism_config.py",
       "state.py", "optimizer.py", "scheduler.py"]
)


def _module_name(face: str) -> str:
    name = "hasten." + face.removesuffix(".py").replace("/", ".")
    return name.removesuffix(".__init__")


def _is_plain_alias(node: ast.Assign) -> bool:
    """`A = B` or `A = b.c`: a second name for something defined elsewhere."""
    return (len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, (ast.Name, ast.Attribute)))


def _assigns_all(node: ast.AST) -> bool:
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    return all(isinstance(t, ast.Name) and t.id == "__all__" for t in targets)


def _is_main_guard(node: ast.AST) -> bool:
    """``if __name__ == "__main__":`` whose only statement runs `main()` (``main()`` or ``raise SystemExit(main())``)."""
    if not (isinstance(node, ast.If) and not node.orelse and len(node.body) == 1
            and ast.unparse(node.test) == "__name__ == '__main__'"):
        return False
    return ast.unparse(node.body[0]) in ("main()", "raise SystemExit(main())")


def logic_in(source: str) -> list[str]:
    """The statements of a module that are more than a docstring, imports, `__all__`, plain aliases and a main guard."""
    found = []
    for index, node in enumerate(ast.parse(source).body):
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and _assigns_all(node):
            continue
        if isinstance(node, ast.Assign) and _is_plain_alias(node) or _is_main_guard(node):
            continue
        found.append(f"line {node.lineno}: {ast.unparse(node).splitlines()[0]}")
    return found


def test_the_check_sees_code():
    face = '"""doc"""\nfrom .x import A, B, main\n__all__ = ["A", "C"]\nC = B\nif __name__ == "__main__":\n    main()\n'
    assert logic_in(face) == []
    assert logic_in('if __name__ == "__main__":\n    main()\n    work()\n') == ["line 1: if __name__ == '__main__':"]
    code = ('"""doc"""\nimport os\ndef f():\n    pass\nclass K:\n    pass\nX = os.environ.get("X")\n'
            'if X:\n    pass\n_LAZY = {"a": "b"}\n')
    assert logic_in(code) == ["line 3: def f():", "line 5: class K:", "line 7: X = os.environ.get('X')",
                              "line 8: if X:", "line 10: _LAZY = {'a': 'b'}"]


@pytest.mark.parametrize("face", FACES)
def test_face_only_re_exports(face):
    found = logic_in((SRC / face).read_text())
    assert not found, f"hasten/{face} is a face of an Accelerate path; move this code to hasten's own modules: {found}"


@pytest.mark.parametrize("face", FACES)
def test_face_names_are_defined_in_hastens_own_modules(face):
    if face == "utils/rich.py":  # importing it installs rich tracebacks, or refuses without rich (as Accelerate's)
        pytest.skip("utils/rich.py re-exports no names; its import is the feature")
    module = importlib.import_module(_module_name(face))
    faces = {_module_name(f) for f in FACES}
    defined_in_a_face = []
    for name in getattr(module, "__all__", []):
        value = getattr(module, name)
        home = getattr(value, "__module__", None) if inspect.isclass(value) or inspect.isfunction(value) else None
        if home in faces:
            defined_in_a_face.append(f"{name} ({home})")
    assert not defined_in_a_face, f"{_module_name(face)} re-exports names whose code is in a face: {defined_in_a_face}"
