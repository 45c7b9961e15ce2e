"""The accelerate switch (`hasten.as_accelerate`, `hasten launch --as-accelerate`): each case in a fresh interpreter.

The switch changes the importing process for good, so every check runs
in a subprocess; the pytest process itself never turns it on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import launch, run_with_timeout

SITE = str(Path(__file__).resolve().parents[1] / "src" / "hasten" / "_accelerate_site")


def python(code: str, env: dict[str, str] | None = None, timeout: float = 90) -> subprocess.CompletedProcess:
    environment = {**os.environ, **(env or {})}
    environment.pop("HASTEN_AS_ACCELERATE", None)
    return run_with_timeout([sys.executable, "-c", textwrap.dedent(code)], timeout, environment)


def real_accelerate_directory() -> str:
    """Where the real accelerate package is installed (asked in a process without the switch)."""
    result = python("import importlib.util; print(list(importlib.util.find_spec('accelerate').submodule_search_locations)[0])")
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_import_accelerate_gets_hasten_and_its_version_checks_pass() -> None:
    real = real_accelerate_directory() if "accelerate" in sys.modules or _installed("accelerate") else "<none>"
    result = python(f"""
        import hasten.as_accelerate
        import importlib.metadata, json, sys
        import accelerate, hasten
        from accelerate.utils import DistributedType, find_executable_batch_size
        from accelerate.state import PartialState
        import accelerate.utils.memory as memory
        from transformers.utils.import_utils import is_accelerate_available
        loaded = [m.__file__ for m in list(sys.modules.values()) if str(getattr(m, "__file__", "")).startswith({real!r})]
        print(json.dumps({{
            "same": accelerate is hasten, "version": accelerate.__version__,
            "metadata": importlib.metadata.version("accelerate"),
            "dist": str(importlib.metadata.distribution("accelerate")._path),
            "transformers": is_accelerate_available("1.1.0"),
            "partial_state": PartialState.__module__, "memory": [memory.__name__, memory.__spec__.name],
            "real_files": loaded, "distributed": DistributedType.MULTI_CPU.value}}))
    """)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["same"] and seen["version"] == seen["metadata"] == "1.16.0"
    assert seen["dist"].startswith(SITE)  # the switch's dist-info answers, not an installed accelerate
    assert seen["transformers"] is True
    assert seen["partial_state"].startswith("hasten.") and seen["memory"] == ["hasten.utils.memory"] * 2
    assert seen["real_files"] == []  # the real package, installed here as a test dependency, is never imported
    assert seen["distributed"] == "MULTI_CPU"


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def test_children_inherit_the_switch() -> None:
    result = python("""
        import hasten.as_accelerate, subprocess, sys
        out = subprocess.run([sys.executable, "-c", "import accelerate, importlib.metadata as m; "
                              "print(accelerate.__name__, m.version('accelerate'))"], capture_output=True, text=True)
        print(out.stdout.strip(), out.returncode, out.stderr[-300:])
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1].startswith("hasten 1.16.0 0")


def test_real_accelerate_imported_first_is_refused_in_one_sentence() -> None:
    if not _installed("accelerate"):
        pytest.skip("needs the real accelerate installed (the test extra has it)")
    result = python("""
        import accelerate
        try:
            import hasten.as_accelerate
        except ImportError as error:
            print(type(error).__name__, "|", error)
    """)
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith("AccelerateSwitchError |") and "import hasten.as_accelerate` first" in line


def test_a_module_hasten_lacks_names_itself() -> None:
    result = python("""
        import hasten.as_accelerate
        try:
            import accelerate.commands.menu  # Accelerate's terminal menus: no library imports them
        except ModuleNotFoundError as error:
            print(error.name, "|", error)
    """)
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith("accelerate.commands.menu | accelerate.commands.menu is not provided by hasten")


def test_library_imported_before_the_switch_is_warned_about() -> None:
    result = python("""
        import warnings
        import transformers
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import hasten.as_accelerate
        print([str(w.message) for w in caught if "switch" in str(w.message)])
    """)
    assert result.returncode == 0, result.stderr
    assert "transformers imported before hasten's accelerate switch" in result.stdout


def test_uninstall_restores_the_process() -> None:
    result = python("""
        import os, sys
        from hasten.process import aliasing
        before = (list(sys.path), os.environ.get("PYTHONPATH"))
        aliasing.install()
        import accelerate
        aliasing.uninstall()
        print(aliasing.installed(), "accelerate" in sys.modules, (list(sys.path), os.environ.get("PYTHONPATH")) == before,
              os.environ.get("HASTEN_AS_ACCELERATE"))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "False False True None"


SCRIPT = """
import importlib.metadata, json, os, sys
import accelerate
from accelerate import Accelerator
accelerator = Accelerator(cpu=True)
total = accelerator.reduce(__import__("torch").tensor(float(accelerator.process_index + 1)), "sum")
with open(os.path.join(sys.argv[1], f"rank{accelerator.process_index}.json"), "w") as f:
    json.dump({"module": accelerate.__name__, "version": importlib.metadata.version("accelerate"),
               "class": type(accelerator).__module__, "total": float(total), "env": os.environ.get("HASTEN_AS_ACCELERATE")}, f)
"""


@pytest.mark.multiprocess
@pytest.mark.parametrize("how", ["flag", "environment"])
def test_hasten_launch_as_accelerate_switches_every_process(tmp_path: Path, how: str) -> None:
    script = tmp_path / "uses_accelerate.py"
    script.write_text(SCRIPT)
    flag = ("--as-accelerate",) if how == "flag" else ()
    env = {"HASTEN_AS_ACCELERATE": "1"} if how == "environment" else {}
    launch(script, str(tmp_path), launch_args=flag, env=env, timeout=120)
    ranks = {int(p.stem[4:]): json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")}
    assert sorted(ranks) == [0, 1]
    for seen in ranks.values():
        assert seen == {"module": "hasten", "version": "1.16.0", "class": "hasten.accelerator", "total": 3.0, "env": "1"}


def test_hasten_launch_as_accelerate_on_one_process(tmp_path: Path) -> None:
    script = tmp_path / "uses_accelerate.py"
    script.write_text(SCRIPT)
    launch(script, str(tmp_path), num_processes=1, launch_args=("--as-accelerate",), timeout=90)
    assert json.loads((tmp_path / "rank0.json").read_text())["module"] == "hasten"


@pytest.mark.multiprocess
def test_python_m_accelerate_commands_launch_runs_hasten_under_the_switch(tmp_path: Path) -> None:
    """`python -m accelerate.commands.launch` (how test suites start Accelerate) runs hasten's module as __main__."""
    script = tmp_path / "uses_accelerate.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SITE, os.environ.get("PYTHONPATH", "")])}
    env.pop("HASTEN_AS_ACCELERATE", None)
    result = run_with_timeout([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                               str(script), str(tmp_path)], 120, env)
    assert result.returncode == 0, result.stderr
    ranks = {int(p.stem[4:]): json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")}
    assert sorted(ranks) == [0, 1] and all(seen["module"] == "hasten" and seen["total"] == 3.0 for seen in ranks.values())
    usage = run_with_timeout([sys.executable, "-m", "accelerate.commands.accelerate_cli", "--help"], 60, env)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: accelerate <command> [<args>]"), usage.stderr
