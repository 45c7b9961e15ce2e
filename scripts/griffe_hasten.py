"""Griffe extension used by the documentation build (mkdocs.yml -> mkdocstrings -> python -> extensions).

hasten's docstrings are Google style but head their doctests with
``Example:`` (singular). Griffe's Google parser knows only ``Examples:``
as the section that renders ``>>>`` lines as code; a singular heading
becomes an admonition whose doctest lines would render as nested block
quotes. This extension renames the heading while the API reference is
built, so the source keeps its spelling and the pages show code.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_SINGULAR = re.compile(r"^(\s*)Example:[ \t]*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Read ``Example:`` as the ``Examples:`` section in every docstring."""

    def on_object(self, *, obj: Any, **kwargs: Any) -> None:
        docstring = getattr(obj, "docstring", None)
        if docstring is not None and "Example:" in docstring.value:
            docstring.value = _SINGULAR.sub(r"\1Examples:", docstring.value)
