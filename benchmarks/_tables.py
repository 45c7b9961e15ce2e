"""The formatting helpers of RESULTS.md: a figure, a verdict, a Markdown table."""

from __future__ import annotations


def f(value, digits: int = 2, unit: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def verdict(ok) -> str:
    return "—" if ok is None else ("ok" if ok else "**MISSED**")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    def cell(value) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(cell(c) for c in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return out + [""]
