"""The launcher -> worker contract stays in one file: hasten.process.launch_spec.

Every ``HASTEN_*`` variable is named once, as a constant of
`hasten.process.launch_spec`; other modules use the constant (no string literal
spells one), their docs mention only variables that exist, and
docs/troubleshooting.md lists exactly those variables.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from hasten.process import launch_spec
from hasten.process.launch_spec import (
    CPU_FP16_ENV,
    DEBUG_ENV,
    LOG_LEVEL_ENV,
    PEER_LOG_LEVEL_ENV,
    SPEC_ENV_VAR,
    WATCHDOG_ENV,
    LaunchSpec,
    cpu_fp16_enabled,
    debug_requested,
    log_level_from_env,
    watchdog_enabled,
)

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src" / "hasten"
CONTRACT = SOURCE / "process" / "launch_spec.py"
NAME = re.compile(r"\bHASTEN_[A-Z0-9_]*")


def _declared() -> set[str]:
    """The variables launch_spec names: its upper-case string constants that start with HASTEN_."""
    return {value for key, value in vars(launch_spec).items()
            if key.isupper() and isinstance(value, str) and value.startswith("HASTEN_")}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string nodes that are docstrings (prose and examples, not values the code uses)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def _sources() -> list[Path]:
    return sorted(path for path in SOURCE.rglob("*.py") if path != CONTRACT)


def test_no_module_but_launch_spec_spells_a_hasten_variable():
    offenders = []
    for path in _sources():
        tree = ast.parse(path.read_text(), filename=str(path))
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):  # f-strings' literal parts are Constant nodes too
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                if "HASTEN_" in node.value:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not offenders, "use the constant from hasten.process.launch_spec instead:\n" + "\n".join(offenders)


def test_docs_and_comments_mention_only_declared_variables():
    declared = _declared()
    unknown = [f"{path.relative_to(ROOT)}: {name}" for path in _sources()
               for name in sorted(set(NAME.findall(path.read_text())) - declared)]
    assert not unknown, "not a variable of hasten.process.launch_spec:\n" + "\n".join(unknown)


def test_each_variable_is_declared_once():
    values = [value for key, value in vars(launch_spec).items()
              if key.isupper() and isinstance(value, str) and value.startswith("HASTEN_")]
    assert len(values) == len(set(values))
    assert {"HASTEN_LAUNCH_SPEC", "HASTEN_BOARD_DIR", "HASTEN_PROGRESS_FILE", "HASTEN_PREEMPTION_RECORD",
            "HASTEN_DEBUG", "HASTEN_WATCHDOG"} <= set(values)


def test_troubleshooting_lists_exactly_the_declared_variables():
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    section = text.split("\n## Environment variables\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    listed = [NAME.search(row).group(0) for row in rows if NAME.search(row)]
    assert sorted(listed) == sorted(_declared()), "docs/troubleshooting.md#environment-variables: one row a variable"
    for row in rows:
        assert row.count("|") == 5, f"each row says: variable | set by | meaning | default: {row}"


@pytest.mark.parametrize("env, expected", [
    ({}, False), ({DEBUG_ENV: "1"}, True), ({DEBUG_ENV: "0"}, False), ({DEBUG_ENV: ""}, False),
    ({SPEC_ENV_VAR: '{"debug": true}'}, True), ({**LaunchSpec(debug=True).to_env(), DEBUG_ENV: "0"}, True),
])
def test_debug_mode_comes_from_the_spec_or_the_variable(env, expected):
    assert debug_requested(env) is expected


def test_process_settings_read_as_documented(monkeypatch):
    assert watchdog_enabled({}) and watchdog_enabled({WATCHDOG_ENV: "1"}) and not watchdog_enabled({WATCHDOG_ENV: "0"})
    assert cpu_fp16_enabled({CPU_FP16_ENV: "1"}) and not cpu_fp16_enabled({CPU_FP16_ENV: "yes"})
    assert log_level_from_env({LOG_LEVEL_ENV: "DEBUG", PEER_LOG_LEVEL_ENV: "INFO"}) == "DEBUG"
    assert log_level_from_env({LOG_LEVEL_ENV: "", PEER_LOG_LEVEL_ENV: "INFO"}) == "INFO"
    assert log_level_from_env({}) is None
    # without an argument each reads this process's environment
    monkeypatch.setenv(WATCHDOG_ENV, "0")
    monkeypatch.setenv(DEBUG_ENV, "1")
    assert not watchdog_enabled() and debug_requested()
