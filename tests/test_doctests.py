"""Every `>>>` example in src/hasten's docstrings runs: one test per docstring, named by its qualified name.

The docstrings are the documentation (the API reference renders them), so an example that no longer
runs is a documentation bug. Each docstring runs on its own, as a reader would try it: in an empty
working directory, with hasten's process-wide state reset before and after (the `GradientState` Borg,
what an Accelerator told `AcceleratorState`/`PartialState`, a process group left behind) and the
environment and the global random generators (examples call `set_seed`) restored. Examples that start processes (`notebook_launcher`, `debug_launcher`) carry the
`multiprocess` marker like the other tests that do; an example that leaves threads or a service process
behind in the process that runs it (wandb) runs in an interpreter of its own, so the forks of later tests
do not inherit them.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import os
import pkgutil
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hasten

# `hasten/__main__.py` runs the command line when imported, `hasten.as_accelerate` turns the accelerate switch on;
# neither has docstring examples to run here.
# as_accelerate switches the importing process; the rich modules install a traceback handler, or refuse to import
NOT_IMPORTED = {"hasten.__main__", "hasten.as_accelerate", "hasten.utils.rich", "hasten.core.rich_traceback"}
STARTS_PROCESSES = re.compile(r"\b(notebook_launcher|debug_launcher)\(")
# the trackers' examples need their (optional) package; without it the tracker raises hasten's ImportError
NEEDS = {"hasten.tracking.mlflow": "mlflow", "hasten.tracking.tensorboard": "tensorboard", "hasten.tracking.wandb": "wandb"}
# wandb.init starts a service process and telemetry threads that outlive `finish()` in the calling process
OWN_INTERPRETER = {"hasten.tracking.wandb.WandBTracker"}


def _modules() -> list[str]:
    return sorted(info.name for info in pkgutil.walk_packages(hasten.__path__, "hasten.")
                  if info.name not in NOT_IMPORTED) + ["hasten"]


def _absent_dependency(error: BaseException) -> str | None:
    """The name of a third-party package that is not installed, when that is what `error` says; else None."""
    name = getattr(error, "name", None)
    if isinstance(error, ModuleNotFoundError) and name and not name.startswith("hasten"):
        top = name.split(".")[0]
        if importlib.util.find_spec(top) is None:
            return top
    return None


def _collect() -> list:
    finder = doctest.DocTestFinder(exclude_empty=True)
    params = []
    for name in _modules():
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:  # an optional engine or tracker whose package is not installed
            if (absent := _absent_dependency(error)) is None:
                raise
            params.append(pytest.param(None, id=name, marks=pytest.mark.skip(reason=f"needs {absent} (not installed)")))
            continue
        for test in finder.find(module, name):
            if not test.examples:
                continue
            marks = [pytest.mark.multiprocess] if any(STARTS_PROCESSES.search(e.source) for e in test.examples) else []
            if name in NEEDS and importlib.util.find_spec(NEEDS[name]) is None:
                marks.append(pytest.mark.skip(reason=f"needs {NEEDS[name]} (not installed)"))
            params.append(pytest.param(test, id=test.name, marks=marks))
    return params


DOCTESTS = _collect()


class _Runner(doctest.DocTestRunner):
    """Keeps the unexpected exceptions, so an example that needs an absent package is skipped, not failed."""

    def __init__(self) -> None:
        super().__init__(verbose=False)
        self.unexpected: list[BaseException] = []

    def report_unexpected_exception(self, out, test, example, exc_info) -> None:  # type: ignore[override]
        self.unexpected.append(exc_info[1])
        super().report_unexpected_exception(out, test, example, exc_info)


def _reset_process_state() -> None:
    """What one example may leave for the next: hasten's shared state and a default process group."""
    import torch.distributed as dist

    from hasten.state import AcceleratorState, GradientState

    GradientState._reset_state()
    AcceleratorState._reset_state(True)
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


_RUN_ONE = """
import doctest, importlib, sys
module_name, test_name = sys.argv[1:]
(test,) = [t for t in doctest.DocTestFinder().find(importlib.import_module(module_name), module_name)
           if t.name == test_name]
result = doctest.DocTestRunner().run(test)
sys.exit(1 if result.failed else 0)
"""


def _run_in_own_interpreter(test) -> None:
    module = test.globs["__name__"]
    result = subprocess.run([sys.executable, "-c", _RUN_ONE, module, test.name], capture_output=True, text=True,
                            timeout=120)
    if result.returncode != 0:
        pytest.fail(f"examples of {test.name} failed in their own interpreter:\n{result.stdout}\n{result.stderr}",
                    pytrace=False)


def _random_states() -> tuple:
    import numpy as np
    import torch

    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def _restore_random_states(states: tuple) -> None:
    import numpy as np
    import torch

    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.set_rng_state(states[2])


def test_docstring_examples_were_found():
    # a floor, so a collection that silently finds nothing (or drops whole modules) fails
    assert sum(p.values[0] is not None for p in DOCTESTS) > 400


@pytest.mark.parametrize("test", DOCTESTS)
def test_docstring_example(test, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # no user config reaches `hasten launch` examples
    if test.name in OWN_INTERPRETER:
        return _run_in_own_interpreter(test)
    saved_environ = dict(os.environ)
    saved_path, saved_excepthook = list(sys.path), sys.excepthook
    saved_random = _random_states()
    _reset_process_state()
    runner = _Runner()
    report: list[str] = []
    # the globals are a copy of the module's made at collection: each run gets a fresh copy of that copy
    fresh = doctest.DocTest(test.examples, dict(test.globs), test.name, test.filename, test.lineno, test.docstring)
    try:
        result = runner.run(fresh, out=report.append, clear_globs=True)
    finally:
        _reset_process_state()
        os.environ.clear()
        os.environ.update(saved_environ)
        sys.path[:] = saved_path
        sys.excepthook = saved_excepthook
        _restore_random_states(saved_random)
    if result.failed:
        absent = [name for error in runner.unexpected if (name := _absent_dependency(error))]
        if absent and len(runner.unexpected) == result.failed:
            pytest.skip(f"needs {absent[0]} (not installed)")
        where = str(Path(test.filename).relative_to(Path(hasten.__file__).parents[1]))
        if test.lineno is not None:  # None for docstrings doctest cannot place (properties, generated classes)
            where += f":{test.lineno + 1}"
        pytest.fail(f"{result.failed} of {result.attempted} examples of {test.name} ({where}) failed:\n"
                    + "".join(report), pytrace=False)
