"""The restart path's scenarios (tests/test_elastic.py) under `--elastic_recovery live`, with the same ordinary script
(`scripts/elastic_train.py`: `load_state()` at the start, periodic checkpoints, paced micro-batches, several epochs)
and the same uninterrupted reference runs:

- FSDP2 with the script's accumulation 3 (`1:2`, 6 micro-batches a step): machine 1 stopped with SIGTERM inside an
  accumulation cycle, started again, SIGKILLed inside a cycle, started again;
- three machines in a `1:3` range (one process each, 3 micro-batches a step: two machines deal it unevenly): one is
  lost, then another, then both come back.

Under live recovery each machine's script sees its own machine's group (`num_processes` 1 here), so a step's records
are one per machine. What is compared with the uninterrupted run: every optimizer step of every epoch, its learning
rate, the samples of each step (each in a record of the step: a machine SIGKILLed right after it committed a step
leaves no record of it, and a step attempt that did not commit is in the script's own list of the step too), and the
final parameters (1e-5 relative), which hold every sample once.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from safetensors.torch import load_file

from test_elastic import THREE_OF_ONE, TWO_OF_THREE, counted, reference, stop_and_kill_inside_cycles, three_machines

pytestmark = pytest.mark.multiprocess

LIVE = ("--elastic_recovery", "live")


def assert_same_numbers(name: str, recipe, out: Path, uninterrupted: Path) -> float:
    steps, ref = counted(out), counted(uninterrupted)
    assert sorted(steps) == sorted(ref) == list(range(1, recipe.epochs * recipe.steps_per_epoch + 1)), sorted(steps)
    for step, rows in steps.items():
        assert {r["lr"] for r in rows} == {ref[step][0]["lr"]}, f"{name}: the LR of step {step} differs"
        missing = {i for r in ref[step] for i in r["seen"]} - {i for r in rows for i in r["seen"]}
        assert not missing or len(rows) < len(ref[step]), f"{name}: step {step} did not train {sorted(missing)}"
    final, expected = load_file(str(out / "final.safetensors")), load_file(str(uninterrupted / "final.safetensors"))
    worst = max(((final[k] - expected[k]).abs().max() / expected[k].abs().max().clamp_min(1e-12)).item() for k in final)
    assert worst <= 1e-5, f"{name}: final parameters differ from the uninterrupted run's by {worst:.3g} (relative)"
    return worst


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("live-scenarios")
    results: dict[str, object] = {}
    recipes = {"fsdp-3": replace(TWO_OF_THREE, engine="fsdp", launch=LIVE), "three": THREE_OF_ONE}
    references: dict[str, Path] = {}

    def run(name: str) -> None:
        try:
            out = root / name
            scenario = three_machines(name, out, *LIVE) if name == "three" else \
                stop_and_kill_inside_cycles(name, recipes[name], out)
            results[name] = scenario
        except BaseException as error:  # noqa: BLE001 - reported by the scenario's test
            results[name] = error

    def uninterrupted(name: str) -> None:
        references[name] = reference(replace(recipes[name], engine="ddp", launch=()), root / f"uninterrupted-{name}")

    threads = [threading.Thread(target=target, args=(name,)) for name in recipes for target in (uninterrupted, run)]
    for thread in threads:
        thread.start()
        time.sleep(2.0)  # staggered: launches importing torch at once slow each other's first steps
    for thread in threads:
        thread.join(600)
    return results, references, recipes


@pytest.mark.timeout(700)
@pytest.mark.parametrize("name", ["fsdp-3", "three"])
def test_a_live_run_survives_the_restart_paths_scenarios_with_the_uninterrupted_runs_numbers(runs, name):
    results, references, recipes = runs
    scenario = results[name]
    if isinstance(scenario, BaseException):
        raise scenario
    worst = assert_same_numbers(name, recipes[name], scenario.out, references[name])
    logs = "".join(scenario.logs.values())
    print(f"\nlive {name}: survivors' first step after a loss {[round(s, 2) for s in scenario.shrink_seconds]} s, "
          f"machines back in the group {[round(s, 2) for s in scenario.grow_seconds]} s after their command; final "
          f"relative error {worst:.2e}")
    # the survivors shrank the group in memory (a loss between two steps fails no attempt: no "dealt again" then),
    # the machines started again healed from a live peer, and no machine restarted its processes (the restart path's
    # "re-formed" line)
    shrinks = ["3 -> 2 machine(s)", "2 -> 1 machine(s)"] if name == "three" else ["2 -> 1 machine(s)"]
    assert all(f"live group changed: {shrink}" in logs for shrink in shrinks), logs[-3000:]
    assert "state received from a live peer" in logs and "elastic run re-formed" not in logs, logs[-3000:]
