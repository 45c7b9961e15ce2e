"""Lose a machine, keep training: an elastic run shrinks to the survivors and grows back, with nothing lost.

"Machines" on this host are `hasten launch --num_machines MIN:MAX` commands (one worker each) sharing a c10d
endpoint on 127.0.0.1; they run `scripts/elastic_train.py`, an ordinary script (`load_state()` at the start,
hasten's periodic checkpoints every 2 optimizer steps) whose micro-batches are paced so that a signal lands inside
an accumulation cycle. Each run is compared with the uninterrupted run of its recipe (the script on MAX processes of
one plain launch, under DDP: every engine trains the same numbers):
- every sample of every epoch is used exactly once in the steps that count (a step redone after a loss counts in
  its last execution);
- the learning rate of every optimizer step is the uninterrupted run's;
- the final parameters are the uninterrupted run's, up to float reordering (1e-5 relative).

The runs:
- for DDP, FSDP2 and DeepSpeed ZeRO-2, with the script's accumulation 1 (a `1:3` range on two machines: 3
  micro-batches a step over 2 processes, so one takes two and, under FSDP2 and ZeRO, the other a filler pass) and
  3 (a `1:2` range: 6 micro-batches, 3 each; ZeRO-2's accumulation given by a DeepSpeed config file at launch, with
  `--elastic_recovery live`, which ZeRO answers with this restart path and a line saying so): machine
  1 is stopped with SIGTERM inside an accumulation cycle (it saves at the next optimizer step: nothing redone), started
  again, SIGKILLed inside a cycle, started again; the run finishes;
- three machines in a `1:3` range, started machine 1 and 2 first (machine 0 still hosts the store): one is lost (two
  processes hold the batch of three), then another, then both come back;
- DDP: a machine that comes back while the group is still re-forming and is then lost again.
The runs go on side by side (each mostly waits: on the rendezvous, or in its paced steps).

A network partition, not only a kill, is tests/test_elastic_liveness.py's (two network namespaces: the side without
the rendezvous store stops within the liveness limit, the side with it names the silent machine within it and goes
on); here, the machine holding the store is lost, and the others stop with one line.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from safetensors.torch import load_file

from conftest import SCRIPTS, run_with_timeout
from machines import SHORT_RDZV, Machine, clean_env, kill_marked, rendezvous_port, wait_for

pytestmark = pytest.mark.multiprocess

SCRIPT = SCRIPTS / "elastic_train.py"
SAMPLES, BATCH = 96, 4  # 24 micro-batches an epoch
ENGINES = ["ddp", "fsdp", "z2"]
SHRINK_LIMIT = 60.0  # seconds from the kill to the first step on the survivor (the bound)
SLOW, FAST = "0.3", "0.02"  # seconds a micro-batch: while the test sends signals and restarts; to finish


@dataclass(frozen=True)
class Recipe:
    """What the uninterrupted run is: processes at MAX, the script's accumulation, epochs, the engine."""

    engine: str
    max_processes: int = 2
    accumulation: int = 1
    epochs: int = 3
    launch: tuple[str, ...] = ()  # launch flags of the recipe (a DeepSpeed config file, say)

    @property
    def steps_per_epoch(self) -> int:
        return -(-(SAMPLES // BATCH) // (self.max_processes * self.accumulation))

    def script_args(self, out: Path, pace: str, *more: str) -> list[str]:
        return [str(SCRIPT), str(out), self.engine, pace, str(self.epochs), str(self.accumulation),
                str(self.max_processes), *more]


# ---------------------------------------------------------------------------------------------- what they wrote
def records(out: Path, name: str = "steps") -> list[dict]:
    rows = []
    for path in out.glob(f"{name}.rank*.jsonl"):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):  # a line being written
                rows.append(json.loads(line))
    return rows


def counted(out: Path) -> dict[int, list[dict]]:
    """Each optimizer step's records from its last execution (a step redone after a loss counts once, last)."""
    by_step: dict[int, list[dict]] = {}
    for row in records(out):
        by_step.setdefault(row["step"], []).append(row)
    # one execution's records (one per process) are milliseconds apart; a redo comes >= seconds later
    return {step: [r for r in rows if max(x["time"] for x in rows) - r["time"] < 1.0] for step, rows in by_step.items()}


def steps_at(out: Path, world: int, after: float = 0.0) -> list[dict]:
    """The records of steps trained by a group of `world` processes after `after`: a step's last execution has one
    record per process of its group (a live run's processes each see their machine's group only: counted so)."""
    return [r for rows in counted(out).values() if len(rows) == world for r in rows if r["time"] > after]


def inside_a_cycle(out: Path) -> bool:
    """A process has just trained a micro-batch that did not end its step."""
    micro = records(out, "micro")
    steps = [r["time"] for r in records(out)]
    return bool(micro) and max(r["time"] for r in micro) > max(steps, default=0.0) and \
        time.time() - max(r["time"] for r in micro) < 0.2


@dataclass
class ElasticRun:
    """Machines of one elastic run and what they measured."""

    name: str
    recipe: Recipe
    out: Path
    machines: list[Machine] = field(default_factory=list)
    shrink_seconds: list[float] = field(default_factory=list)  # each loss -> the first step of the smaller group
    grow_seconds: list[float] = field(default_factory=list)  # each restart -> the first step of the larger group
    logs: dict[str, str] = field(default_factory=dict)
    manifest: dict = field(default_factory=dict)  # a checkpoint's manifest the scenario kept to look at

    def pace(self, seconds: str) -> None:
        (self.out / "pace").write_text(seconds)

    def step_alone(self, world: int, since: float, what: str, count: int = 2) -> float:
        """Wait for `count` steps of a group of `world` after `since`; returns the first one's time."""
        wait_for(lambda: len({r["step"] for r in steps_at(self.out, world, since)}) >= count, 180,
                 f"{self.name}: {count} steps on {world} process(es) {what}", self.machines)
        return min(r["time"] for r in steps_at(self.out, world, since)) - since

    def finish(self) -> None:
        self.pace(FAST)
        for machine in self.machines:
            if machine.process is not None and machine.process.poll() is None:
                code = machine.wait(300)
                assert code == 0, f"{self.name}: {machine.log.name} exited {code}:\n{machine.log.read_text()[-6000:]}"
        self.logs = {m.log.name: m.log.read_text() for m in self.machines}


@contextlib.contextmanager
def elastic_run(name: str, recipe: Recipe, out: Path, machines: int, *extra: str, main_ip: str = "127.0.0.1",
                prefixes: tuple[tuple[str, ...], ...] | None = None, order: tuple[int, ...] | None = None,
                steps: int = 3, script: tuple[str, ...] = ()):
    """`machines` machines of one elastic run (MIN 1, MAX the recipe's), started in `order` (machine 0 last: it still
    hosts the store) and trained together for `steps` steps; every process of each is killed when the block ends."""
    out.mkdir(parents=True, exist_ok=True)
    port = rendezvous_port()
    run = ElasticRun(name, recipe, out)
    run.pace(SLOW)
    for rank in range(machines):
        command = [*(prefixes[rank] if prefixes else ()), sys.executable, "-m", "hasten", "launch",
                   "--num_machines", f"1:{recipe.max_processes}", "--num_processes", str(recipe.max_processes),
                   "--machine_rank", str(rank), "--main_process_ip", main_ip, "--main_process_port", str(port),
                   "--max_restarts", "4", *SHORT_RDZV, *recipe.launch, *extra, *recipe.script_args(out, SLOW, *script)]
        run.machines.append(Machine(command, f"{name}-{rank}-{port}", out / f"machine{rank}.log"))
    try:
        for rank in order or range(machines):
            run.machines[rank].start()
            time.sleep(1.0)
        if steps:
            wait_for(lambda: len({r["step"] for r in steps_at(out, machines)}) >= steps, 240,
                     f"{name}: {steps} steps on {machines} machines", run.machines)
        yield run
    finally:
        for machine in run.machines:
            kill_marked(machine.mark)


# ---------------------------------------------------------------------------------------------- the scenarios
def stop_and_kill_inside_cycles(name: str, recipe: Recipe, out: Path) -> ElasticRun:
    """Two machines: machine 1 stopped with SIGTERM inside an accumulation cycle, started again, SIGKILLed inside a
    cycle, started again; the run finishes."""
    with elastic_run(name, recipe, out, 2) as run:
        machine = run.machines[1]
        wait_for(lambda: inside_a_cycle(out), 120, f"{name}: a moment inside a cycle", run.machines)
        stopped = time.time()
        machine.terminate()
        code = machine.wait(90)  # it saves at the next optimizer step, then every process of it has ended
        assert code != 0, f"{name}: machine 1 exited 0 after SIGTERM:\n{machine.log.read_text()[-3000:]}"
        run.shrink_seconds.append(run.step_alone(1, stopped, "after the graceful stop", count=1))
        restarted = time.time()
        machine.start()
        run.grow_seconds.append(run.step_alone(2, restarted, "after machine 1 came back"))
        wait_for(lambda: inside_a_cycle(out), 120, f"{name}: a moment inside a cycle", run.machines)
        killed = time.time()
        machine.kill()
        run.shrink_seconds.append(run.step_alone(1, killed, "after the kill", count=1))
        restarted = time.time()
        machine.start()
        run.grow_seconds.append(run.step_alone(2, restarted, "after machine 1 came back again", count=1))
        run.finish()
    return run


def three_machines(name: str, out: Path, *extra: str) -> ElasticRun:
    """`1:3`, one process each, machines 1 and 2 started first: lose one (two processes hold the batch of three),
    lose another, then both come back; the run finishes on three."""
    recipe = THREE_OF_ONE
    with elastic_run(name, recipe, out, 3, *extra, order=(1, 2, 0)) as run:
        for lost, world in ((2, 2), (1, 1)):
            killed = time.time()
            run.machines[lost].kill()
            run.shrink_seconds.append(run.step_alone(world, killed, f"after machine {lost} was lost"))
        restarted = time.time()
        run.machines[1].start()
        run.machines[2].start()
        run.grow_seconds.append(run.step_alone(3, restarted, "after both came back", count=1))
        run.finish()
    return run


def returns_mid_reformation_then_lost_again(name: str, out: Path) -> ElasticRun:
    """DDP: machine 1 is killed, started again while machine 0 is still re-forming the group, killed again once the
    group has two machines again; the run finishes on machine 0 alone."""
    with elastic_run(name, TWO_OF_THREE, out, 2) as run:
        killed = time.time()
        run.machines[1].kill()
        time.sleep(3.0)  # the survivor's collective has failed; its agent is re-forming the group
        assert not steps_at(out, 1, killed), "the survivor stepped alone before the machine came back"
        run.machines[1].start()
        run.step_alone(2, killed, "after the return")
        again = time.time()
        run.machines[1].kill()
        run.step_alone(1, again, "after the second loss", count=1)
        run.finish()
    return run


def saved_inside_a_cycle_then_resumed_on_fewer(name: str, out: Path) -> ElasticRun:
    """Two machines: the script itself calls save_state() inside an accumulation cycle (after 2 of a step's 3
    micro-batches on each process) and ends there; machine 0 alone (another run, another rendezvous) resumes from that
    checkpoint on one process (6 micro-batches a step) and finishes."""
    recipe = TWO_OF_THREE
    with elastic_run(name, recipe, out, 2, steps=0, script=("3",)) as run:
        run.pace(FAST)
        for machine in run.machines:
            assert machine.wait(240) == 0, machine.log.read_text()[-4000:]
    assert (out / "saved_inside").read_text() == "3"
    newest = max((out / "project" / "checkpoints").glob("checkpoint_*"), key=lambda path: int(path.name.split("_")[1]))
    manifest = json.loads((newest / "hasten_checkpoint.json").read_text())
    with elastic_run(name, recipe, out, 1, steps=0) as resumed:
        resumed.pace(FAST)
        resumed.finish()
    resumed.logs.update({f"first-{k}": v for k, v in run.logs.items()})
    resumed.manifest = manifest
    return resumed


def reference(recipe: Recipe, out: Path) -> Path:
    """The uninterrupted run: the same script on MAX processes of one plain launch."""
    out.mkdir(parents=True)
    command = [sys.executable, "-m", "hasten", "launch", "--num_processes", str(recipe.max_processes), *recipe.launch,
               *recipe.script_args(out, "0")]
    result = run_with_timeout(command, 300, clean_env())
    assert result.returncode == 0, f"{recipe} reference failed:\n{result.stdout}\n{result.stderr}"
    return out


def assert_same_training(name: str, recipe: Recipe, out: Path, uninterrupted: Path, tolerance: float = 1e-5) -> None:
    steps, ref = counted(out), counted(uninterrupted)
    per_epoch = recipe.steps_per_epoch
    assert sorted(steps) == sorted(ref) == list(range(1, recipe.epochs * per_epoch + 1)), sorted(steps)
    for epoch in range(recipe.epochs):
        used = sorted(i for step in range(epoch * per_epoch + 1, (epoch + 1) * per_epoch + 1)
                      for row in steps[step] for i in row["seen"])
        expected = sorted(i for step in range(epoch * per_epoch + 1, (epoch + 1) * per_epoch + 1)
                          for row in ref[step] for i in row["seen"])
        assert used == expected and set(used) == set(range(SAMPLES)), \
            f"{name}: epoch {epoch} did not use the uninterrupted run's samples (every one, padding as at MAX)"
    for step in steps:
        assert {r["lr"] for r in steps[step]} == {ref[step][0]["lr"]}, f"{name}: the LR of step {step} differs"
    final, expected = load_file(str(out / "final.safetensors")), load_file(str(uninterrupted / "final.safetensors"))
    assert final.keys() == expected.keys()
    worst = max(((final[k] - expected[k]).abs().max() / expected[k].abs().max().clamp_min(1e-12)).item() for k in final)
    assert worst <= tolerance, f"{name}: final parameters differ from the uninterrupted run's by {worst:.3g} (relative)"


def ds_config(path: Path, accumulation: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": accumulation,
                                "gradient_clipping": 1e6, "train_micro_batch_size_per_gpu": "auto",
                                "train_batch_size": "auto"}))
    return path


# The two recipes of the runs: 3 processes at MAX with the script's accumulation 1, and 2 processes at MAX with
# accumulation 3. Every engine's runs are compared with one uninterrupted run of each recipe under DDP: FSDP2 trains the
# same numbers (tests/test_fsdp.py), and so does ZeRO-2 without gradient clipping (the script and the config file set a norm
# never reached instead of DeepSpeed's default 1.0; tests/test_deepspeed.py).
THREE_OF_ONE = Recipe("ddp", max_processes=3, accumulation=1, epochs=4)
TWO_OF_THREE = Recipe("ddp", max_processes=2, accumulation=3, epochs=6)


def recipes(root: Path) -> dict[str, Recipe]:
    found = {}
    for engine in ENGINES:
        found[f"{engine}-1"] = replace(THREE_OF_ONE, engine=engine)
        if engine == "z2":  # the accumulation from the DeepSpeed config file given at launch, not from the script
            config = ds_config(root / "z2-3-ds.json", 3)
            # launched with --elastic_recovery live too: ZeRO's partitions are on one machine only, so the run says so
            # and takes this restart path (launch/live.py's checkpoint_fallback)
            found["z2-3"] = replace(TWO_OF_THREE, engine="launched",
                                    launch=("--use_deepspeed", "--deepspeed_config_file", str(config),
                                            "--elastic_recovery", "live"))
        else:
            found[f"{engine}-3"] = replace(TWO_OF_THREE, engine=engine)
    return found


# ---------------------------------------------------------------------------------------------- the runs
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every scenario and its uninterrupted reference, side by side."""
    pytest.importorskip("deepspeed")
    root = tmp_path_factory.mktemp("elastic")
    results: dict[str, object] = {}
    plans = recipes(root)

    with ThreadPoolExecutor(2) as pool:  # the uninterrupted runs, while the elastic ones start beside them
        uninterrupted = {recipe: pool.submit(reference, recipe, root / f"uninterrupted-{i}")
                         for i, recipe in enumerate((THREE_OF_ONE, TWO_OF_THREE))}
        scenarios = {"three": lambda out: three_machines("three", out),
                     "twice": lambda out: returns_mid_reformation_then_lost_again("twice", out),
                     "inside": lambda out: saved_inside_a_cycle_then_resumed_on_fewer("inside", out),
                     **{name: (lambda out, name=name: stop_and_kill_inside_cycles(name, plans[name], out))
                        for name in plans}}

        def run(name: str) -> None:
            try:
                scenario = scenarios[name](root / name)
                # its recipe under DDP, as plainly launched: one of the two uninterrupted runs
                results[name] = (scenario, uninterrupted[replace(scenario.recipe, engine="ddp", launch=())].result())
            except BaseException as error:  # noqa: BLE001 - reported by the scenario's test
                results[name] = error

        threads = [threading.Thread(target=run, args=(name,)) for name in scenarios]
        for thread in threads:
            thread.start()
            time.sleep(3.0)  # staggered: launches importing torch at once slow each other's first steps
        for thread in threads:
            thread.join(1200)
    return results


def _result(runs, name: str) -> tuple[ElasticRun, Path]:
    result = runs[name]
    if isinstance(result, BaseException):
        raise result
    return result


@pytest.mark.timeout(1300)
@pytest.mark.parametrize("name", ["ddp-1", "ddp-3", "fsdp-1", "fsdp-3", "z2-1", "z2-3"])
def test_a_machine_stopped_or_killed_inside_an_accumulation_cycle_leaves_the_training_unchanged(runs, name):
    run, uninterrupted = _result(runs, name)
    assert max(run.shrink_seconds) <= SHRINK_LIMIT, f"{name}: a survivor stepped {run.shrink_seconds} s after a loss"
    survivor = run.logs["machine0.log"]
    reformed = [line for line in survivor.splitlines() if "elastic run re-formed: 2 -> 1 processes" in line]
    assert len(reformed) == 2, survivor[-4000:]
    # the graceful stop saved right after an optimizer step: nothing trained twice
    assert "(left: " in reformed[0] and "0 step(s) redone" in reformed[0], reformed[0]
    assert "global batch kept" in reformed[0], reformed[0]
    both = "".join(run.logs.values())
    assert "elastic run re-formed: 1 -> 2 processes" in both and "(joined: " in both, both[-3000:]
    assert_same_training(name, run.recipe, run.out, uninterrupted)
    # each process's share of a step: all M micro-batches alone; shared by two (one more for rank 0 when uneven)
    recipe = run.recipe
    per_step = recipe.max_processes * recipe.accumulation
    assert {(r["world"], r["accumulation"]) for r in records(run.out)} == \
        {(1, per_step), (2, -(-per_step // 2)), (2, per_step // 2)}
    if recipe.engine == "ddp" and recipe.accumulation == 3:
        assert_reformations_on_the_trackers_step_axis(run.out / "project" / "elastic")
    if "live" in recipe.launch:  # each launch of each machine said once why it restarts instead
        for log in run.logs.values():
            assert log.count("DeepSpeed ZeRO partitions its state over every machine") >= 1, log[-3000:]


def assert_reformations_on_the_trackers_step_axis(logs: Path) -> None:
    """Each re-formation is a TensorBoard record, at a step no lower than any step logged before it (read back with
    TensorBoard's own reader)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = []
    for path in sorted(logs.glob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(path))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            events += [(e.wall_time, tag, e.step, e.value) for e in accumulator.Scalars(tag)]
    events.sort()
    reformations = [(wall, step, value) for wall, tag, step, value in events if tag == "elastic/processes"]
    assert [value for _, _, value in reformations] == [1.0, 2.0, 1.0, 2.0], events  # shrunk and grown back, twice
    for wall, step, _ in reformations:
        before = [s for w, tag, s, _ in events if tag == "loss" and w < wall]
        assert before and step >= max(before), f"a re-formation logged at step {step} after step {max(before)}"


@pytest.mark.timeout(1300)
def test_a_checkpoint_the_script_saves_inside_an_accumulation_cycle_resumes_on_another_number_of_processes(runs):
    run, uninterrupted = _result(runs, "inside")
    manifest = run.manifest  # the checkpoint saved inside the cycle, by 2 processes
    # it holds the state at the start of the step under way: no partial gradients, the accumulation count at 0
    assert manifest["run"]["optimizer_steps"] == 3 and manifest["num_processes"] == 2, manifest
    assert manifest["step"] == 0 and not [f for f in manifest["files"] if f.startswith("gradients")], manifest
    assert "resumed from" in run.logs["machine0.log"] and "2 -> 1 processes" in run.logs["machine0.log"]
    assert_same_training("inside", run.recipe, run.out, uninterrupted)


@pytest.mark.timeout(1300)
def test_three_machines_lose_two_and_grow_back_with_the_batch_of_three_held_by_two(runs):
    run, uninterrupted = _result(runs, "three")
    assert max(run.shrink_seconds) <= SHRINK_LIMIT, run.shrink_seconds
    assert_same_training("three", run.recipe, run.out, uninterrupted)
    # 3 micro-batches a step: on two processes one takes 2 and the other 1; alone, 3
    assert {(r["world"], r["accumulation"]) for r in records(run.out)} == {(3, 1), (2, 2), (2, 1), (1, 3)}


@pytest.mark.timeout(1300)
def test_a_machine_that_returns_while_the_group_reforms_and_is_lost_again_leaves_one_consistent_run(runs):
    run, uninterrupted = _result(runs, "twice")
    assert_same_training("twice", run.recipe, run.out, uninterrupted)
    assert {r["world"] for r in records(run.out)} == {1, 2}


# ---------------------------------------------------------------------------------------------- the store's machine
@pytest.mark.timeout(300)
def test_losing_the_machine_that_holds_the_store_ends_the_others_with_one_line(tmp_path):
    """torch's c10d store lives on the main machine: the others cannot re-form without it, and say so."""
    out, liveness = tmp_path / "store", 15.0
    with elastic_run("store", Recipe("ddp"), out, 2, "--liveness_timeout", str(liveness)) as run:
        killed = time.time()
        run.machines[0].kill()
        code = run.machines[1].wait(120)
        stopped = time.time() - killed
    log = run.machines[1].log.read_text()
    assert code != 0, log[-3000:]
    assert ("could not reach the elastic run's rendezvous store" in log
            or "lost its rendezvous store" in log), log[-3000:]
    assert stopped <= liveness + 10.0, f"machine 1 stopped {stopped:.1f} s after the store's machine was lost"
