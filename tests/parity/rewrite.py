"""Rewrite a script written for Accelerate so that it runs on hasten: its import statements only.

This is the "change only the imports" step a user makes, done mechanically so
that the very same file runs under both libraries in the differential tests.

- ``from accelerate[.x] import ...`` becomes ``from hasten[.x] import ...``;
- ``import accelerate[.x]`` becomes ``import hasten[.x]`` bound to the name
  the script uses (``accelerate``), so ``accelerate.__version__`` and
  ``accelerate.utils.set_seed`` keep working;
- ``import accelerate[.x] as y`` becomes ``import hasten[.x] as y``.

Nothing else in the file changes (strings and comments that mention
accelerate stay as they are).

Example:
    >>> print(rewrite_imports("import accelerate\\nfrom accelerate.utils import set_seed\\nx = 'accelerate'"))
    import hasten as accelerate
    from hasten.utils import set_seed
    x = 'accelerate'
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

__all__ = ["rewrite_imports", "rewrite_file"]

_FROM = re.compile(r"^(\s*)from\s+accelerate(\.[\w.]+)?\s+import\b")
_IMPORT = re.compile(r"^(\s*)import\s+(.+)$")


def _rewrite_import_list(names: str) -> str:
    parts = []
    for part in names.split(","):
        stripped = part.strip()
        match = re.fullmatch(r"accelerate((?:\.\w+)*)(\s+as\s+(\w+))?", stripped)
        if not match:
            parts.append(stripped)
            continue
        sub, alias = match.group(1) or "", match.group(3)
        if alias:
            parts.append(f"hasten{sub} as {alias}")
        elif sub:
            # `import accelerate.utils` binds `accelerate` (with .utils loaded): bind hasten under that name.
            parts.append(f"hasten{sub}")
            parts.append("hasten as accelerate")
        else:
            parts.append("hasten as accelerate")
    return ", ".join(parts)


def rewrite_imports(source: str) -> str:
    """`source` with every import of `accelerate` turned into the same import of `hasten` (see module doc)."""
    # Only lines that start a logical line of code are rewritten (not the inside of strings).
    starts: set[int] = set()
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    previous = tokenize.NEWLINE
    for token in tokens:
        if token.type == tokenize.NAME and token.string in ("from", "import") and previous in (
            tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT
        ):
            starts.add(token.start[0])
        if token.type not in (tokenize.COMMENT,):
            previous = token.type
    lines = source.splitlines(keepends=True)
    for number in sorted(starts):
        line = lines[number - 1]
        body, newline = (line[:-1], "\n") if line.endswith("\n") else (line, "")
        match = _FROM.match(body)
        if match:
            lines[number - 1] = _FROM.sub(lambda m: f"{m.group(1)}from hasten{m.group(2) or ''} import", body, count=1) + newline
            continue
        match = _IMPORT.match(body)
        if match and re.search(r"\baccelerate\b", match.group(2)):
            lines[number - 1] = f"{match.group(1)}import {_rewrite_import_list(match.group(2))}{newline}"
    return "".join(lines)


def rewrite_file(source: Path, target: Path) -> Path:
    """Write `source` with its imports rewritten to `target`; return `target`."""
    target.write_text(rewrite_imports(Path(source).read_text()))
    return target
