"""Lose a machine, keep training: an elastic run shrinks to the survivors and grows back, with nothing lost.

Two "machines" on this host (two `hasten launch --num_machines 1:2` commands, one worker each, sharing a c10d
endpoint on 127.0.0.1) run `scripts/elastic_train.py`, an ordinary script (`load_state()` at the start, hasten's
periodic checkpoints every 2 optimizer steps). Machine 1's launcher and worker are SIGKILLed mid-epoch; machine 0
must step alone within 60 s; machine 1 is started again and the run must grow back to two machines and finish.
Across shrink and growth, compared with an uninterrupted 2-process run of the same script:
- every sample of every epoch is used exactly once in the steps that count (a step redone after the loss counts
  in its last execution);
- the learning rate of every optimizer step is the uninterrupted run's;
- the final parameters are the uninterrupted run's, up to float reordering (1e-5 relative);
for DDP, FSDP2 (sharded checkpoints, 2 -> 1 -> 2 processes) and DeepSpeed ZeRO-2; and the same for a machine that
comes back while the group is still re-forming and is then lost again. The runs go on side by side (each mostly
waits: on the rendezvous, or in its paced steps).

A network partition, not only a kill, in two network namespaces: the side without the rendezvous store stops
within the liveness limit, naming the cause; the side with it goes on; after the link is back, the cut machine's
command started again rejoins.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from safetensors.torch import load_file

from conftest import SCRIPTS, run_with_timeout
from machines import clean_env, ip, rendezvous_port, two_namespaces

pytestmark = pytest.mark.multiprocess

SCRIPT = SCRIPTS / "elastic_train.py"
SAMPLES, STEPS_PER_EPOCH, EPOCHS = 96, 12, 3  # at 2 processes x batch 4: global batch 8
MARK = "HASTEN_TEST_ELASTIC_MACHINE"  # in each machine's environment, so the test can kill exactly one machine
ENGINES = ["ddp", "fsdp", "z2"]
SHRINK_LIMIT = 60.0  # seconds from the kill to the first step on the survivor (the bound)


# ---------------------------------------------------------------------------------------------- one machine
def machine_command(rank: int, main_ip: str, port: int, out: Path, engine: str, *extra: str,
                    prefix: tuple[str, ...] = ()) -> list[str]:
    return [*prefix, sys.executable, "-m", "hasten", "launch", "--num_machines", "1:2", "--num_processes", "2",
            "--machine_rank", str(rank), "--main_process_ip", main_ip, "--main_process_port", str(port),
            "--max_restarts", "3", *extra, str(SCRIPT), str(out), engine, "0.2", str(EPOCHS)]


@dataclass
class Machine:
    """One `hasten launch` of the elastic run, its output kept in a file."""

    command: list[str]
    mark: str
    log: Path
    process: subprocess.Popen | None = None

    def start(self) -> "Machine":
        self.process = subprocess.Popen(self.command, stdout=self.log.open("a"), stderr=subprocess.STDOUT,
                                        env=clean_env(**{MARK: self.mark}), start_new_session=True)
        return self

    def kill(self) -> None:
        """SIGKILL the launcher and every process it started (workers run in sessions of their own)."""
        kill_marked(self.mark)
        if self.process is not None:
            self.process.wait(30)

    def wait(self, timeout: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout)


def kill_marked(mark: str) -> None:
    needle = f"{MARK}={mark}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    os.kill(int(entry.name), signal.SIGKILL)


# ---------------------------------------------------------------------------------------------- what they wrote
def records(out: Path) -> list[dict]:
    rows = []
    for path in out.glob("steps.rank*.jsonl"):
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


def wait_for(condition, timeout: float, what: str, machines: list[Machine]) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return time.time()
        time.sleep(0.2)
    logs = "\n".join(f"--- {m.log.name}:\n{m.log.read_text()[-4000:]}" for m in machines)
    pytest.fail(f"{what} did not happen within {timeout:.0f} s\n{logs}")


@contextlib.contextmanager
def two_machines(name: str, engine: str, out: Path, *extra: str, main_ip: str = "127.0.0.1",
                 prefixes: tuple[tuple[str, ...], tuple[str, ...]] = ((), ()), steps: int = 6):
    """Machines 0 and 1 of one elastic run, started (0 first: it hosts the store, the machine that must not be
    lost) and trained together for `steps` steps; every process of both is killed when the block ends."""
    out.mkdir(parents=True, exist_ok=True)
    port = rendezvous_port()
    machines = [Machine(machine_command(rank, main_ip, port, out, engine, *extra, prefix=prefixes[rank]),
                        f"{name}-{rank}-{port}", out / f"machine{rank}.log") for rank in (0, 1)]
    try:
        machines[0].start()
        time.sleep(1.0)
        machines[1].start()
        wait_for(lambda: len(steps_at(out, 2)) >= 2 * steps, 240, f"{name}: {steps} steps on two machines", machines)
        yield machines
    finally:
        for machine in machines:
            kill_marked(machine.mark)


def steps_at(out: Path, world: int, after: float = 0.0) -> list[dict]:
    return [r for r in records(out) if r["world"] == world and r["time"] > after]


@dataclass
class Scenario:
    """What a shrink-and-grow run measured."""

    out: Path
    shrink_seconds: float = 0.0  # kill -> first step on the survivor
    grow_seconds: float = 0.0  # restart -> first step on two machines
    logs: dict[str, str] = field(default_factory=dict)


def returns_mid_reformation_then_lost_again(out: Path) -> Scenario:
    """DDP: machine 1 is killed, started again while machine 0 is still re-forming the group, killed again once the
    group has two machines again; the run finishes on machine 0 alone."""
    scenario = Scenario(out)
    with two_machines("twice", "ddp", out) as machines:
        (out / "pace").write_text("0.6")
        killed = time.time()
        machines[1].kill()
        time.sleep(3.0)  # the survivor's collective has failed; its agent is re-forming the group
        assert not steps_at(out, 1, killed), "the survivor stepped alone before the machine came back"
        machines[1].start()
        wait_for(lambda: len(steps_at(out, 2, killed)) >= 2 * 2, 180, "twice: two machines again", machines)
        again = time.time()
        machines[1].kill()
        wait_for(lambda: steps_at(out, 1, again), 180, "twice: a step alone after the second loss", machines)
        (out / "pace").write_text("0.05")
        code = machines[0].wait(240)
        assert code == 0, f"twice: machine 0 exited {code}:\n{machines[0].log.read_text()[-6000:]}"
    scenario.logs = {m.log.name: m.log.read_text() for m in machines}
    return scenario


def shrink_and_grow(engine: str, out: Path) -> Scenario:
    scenario = Scenario(out)
    with two_machines(engine, engine, out) as machines:
        (out / "pace").write_text("0.6")  # slower from here on: machine 1's return lands mid-run
        killed = time.time()
        machines[1].kill()
        wait_for(lambda: steps_at(out, 1, killed), 180, f"{engine}: a step on the survivor", machines)
        scenario.shrink_seconds = min(r["time"] for r in steps_at(out, 1, killed)) - killed
        wait_for(lambda: len(steps_at(out, 1, killed)) >= 2, 60, f"{engine}: two steps alone", machines)
        (out / "pace").write_text("1.5")
        restarted = time.time()
        machines[1].start()
        wait_for(lambda: steps_at(out, 2, restarted), 180, f"{engine}: a step on two machines again", machines)
        scenario.grow_seconds = min(r["time"] for r in steps_at(out, 2, restarted)) - restarted
        (out / "pace").write_text("0.05")
        for machine in machines:
            code = machine.wait(240)
            assert code == 0, f"{engine}: {machine.log.name} exited {code}:\n{machine.log.read_text()[-6000:]}"
    scenario.logs = {m.log.name: m.log.read_text() for m in machines}
    return scenario


def reference(engine: str, out: Path) -> Path:
    """The uninterrupted run: the same script on 2 processes of one plain launch."""
    out.mkdir(parents=True)
    command = [sys.executable, "-m", "hasten", "launch", "--num_processes", "2", str(SCRIPT), str(out), engine, "0",
               str(EPOCHS)]
    result = run_with_timeout(command, 240, clean_env())
    assert result.returncode == 0, f"{engine} reference failed:\n{result.stdout}\n{result.stderr}"
    return out


def assert_same_training(engine: str, out: Path, uninterrupted: Path, tolerance: float = 1e-5) -> None:
    steps, ref = counted(out), counted(uninterrupted)
    assert sorted(steps) == sorted(ref) == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1)), sorted(steps)
    for epoch in range(EPOCHS):
        used = sorted(i for step in range(epoch * STEPS_PER_EPOCH + 1, (epoch + 1) * STEPS_PER_EPOCH + 1)
                      for row in steps[step] for i in row["seen"])
        assert used == list(range(SAMPLES)), f"{engine}: epoch {epoch} did not use every sample exactly once"
    for step in steps:
        assert {r["lr"] for r in steps[step]} == {ref[step][0]["lr"]}, f"{engine}: the LR of step {step} differs"
    final, expected = load_file(str(out / "final.safetensors")), load_file(str(uninterrupted / "final.safetensors"))
    assert final.keys() == expected.keys()
    worst = max(((final[k] - expected[k]).abs().max() / expected[k].abs().max().clamp_min(1e-12)).item() for k in final)
    assert worst <= tolerance, f"{engine}: final parameters differ from the uninterrupted run's by {worst:.3g} (relative)"


# ---------------------------------------------------------------------------------------------- the runs
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every engine's shrink-and-grow run and its uninterrupted reference, side by side."""
    pytest.importorskip("deepspeed")
    root = tmp_path_factory.mktemp("elastic")
    results: dict[str, object] = {}

    def run(engine: str) -> None:
        try:
            if engine == "twice":
                results[engine] = returns_mid_reformation_then_lost_again(root / engine)
                return
            results[engine] = (shrink_and_grow(engine, root / engine), reference(engine, root / f"{engine}-ref"))
        except BaseException as error:  # noqa: BLE001 - reported by the engine's test
            results[engine] = error

    threads = [threading.Thread(target=run, args=(engine,)) for engine in [*ENGINES, "twice"]]
    for thread in threads:
        thread.start()
        time.sleep(2.0)  # staggered: three launches importing torch at once slow each other's first steps
    for thread in threads:
        thread.join(900)
    return results


@pytest.mark.timeout(960)
@pytest.mark.parametrize("engine", ENGINES)
def test_a_lost_machine_shrinks_the_run_and_its_return_grows_it_with_nothing_lost(runs, engine):
    result = runs[engine]
    if isinstance(result, BaseException):
        raise result
    scenario, uninterrupted = result
    assert scenario.shrink_seconds <= SHRINK_LIMIT, f"{engine}: the survivor stepped {scenario.shrink_seconds:.1f} s " \
                                                    f"after the kill (limit {SHRINK_LIMIT:.0f} s)"
    survivor = scenario.logs["machine0.log"]
    assert "elastic run re-formed: 2 -> 1 processes" in survivor and "(left: " in survivor, survivor[-3000:]
    assert "gradient accumulation 2, global batch kept" in survivor, survivor[-3000:]
    both = "".join(scenario.logs.values())
    assert "elastic run re-formed: 1 -> 2 processes" in both and "(joined: " in both, both[-3000:]
    assert_same_training(engine, scenario.out, uninterrupted)
    # the accumulation each step ran with: 2 batches a process on one machine, 1 on two
    assert {(r["world"], r["accumulation"]) for r in records(scenario.out)} == {(2, 1), (1, 2)}
    if engine == "ddp":
        assert_reformations_on_the_trackers_step_axis(scenario.out / "project" / "elastic")


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
    records = [(wall, step, value) for wall, tag, step, value in events if tag == "elastic/processes"]
    assert [value for _, _, value in records] == [1.0, 2.0], events  # shrunk to 1, grown back to 2
    for wall, step, _ in records:
        before = [s for w, tag, s, _ in events if tag == "loss" and w < wall]
        assert before and step >= max(before), f"a re-formation logged at step {step} after step {max(before)}"


@pytest.mark.timeout(960)
def test_a_machine_that_returns_while_the_group_reforms_and_is_lost_again_leaves_one_consistent_run(runs):
    result = runs["twice"]
    if isinstance(result, BaseException):
        raise result
    uninterrupted = runs["ddp"][1] if isinstance(runs["ddp"], tuple) else reference("ddp", result.out.parent / "ref")
    assert_same_training("twice", result.out, uninterrupted)
    assert {r["world"] for r in records(result.out)} == {1, 2}


# ---------------------------------------------------------------------------------------------- a partition
@pytest.mark.timeout(600)
def test_a_network_partition_stops_the_side_without_the_store_and_the_other_goes_on(tmp_path):
    liveness = 15.0
    out = tmp_path / "partition"
    with two_namespaces("10.200.8") as net:
        namespaces, veths, addresses = net["namespaces"], net["veths"], net["addresses"]
        prefixes = tuple(("ip", "netns", "exec", ns) for ns in namespaces)
        with two_machines("cut", "ddp", out, "--liveness_timeout", str(liveness), main_ip=addresses[0],
                          prefixes=prefixes) as machines:
            (out / "pace").write_text("0.6")
            cut = time.time()
            result = ip("-n", namespaces[1], "link", "set", veths[1], "down")
            assert result.returncode == 0, result.stderr
            code = machines[1].wait(120)
            stopped = time.time() - cut
            cut_log = machines[1].log.read_text()
            assert code != 0 and "could not reach the elastic run's rendezvous store" in cut_log, cut_log[-3000:]
            assert stopped <= liveness + 3.0, f"the cut-off side stopped {stopped:.1f} s after the cut"
            wait_for(lambda: len(steps_at(out, 1, cut)) >= 2, 120, "the store side stepping alone", machines)
            assert ip("-n", namespaces[1], "link", "set", veths[1], "up").returncode == 0
            (out / "pace").write_text("1.5")
            restarted = time.time()
            machines[1].start()
            wait_for(lambda: steps_at(out, 2, restarted), 180, "the cut machine rejoining", machines)
            (out / "pace").write_text("0.05")
            for machine in machines:
                assert machine.wait(240) == 0, machine.log.read_text()[-6000:]
    store_side = machines[0].log.read_text()
    assert "elastic run re-formed: 2 -> 1 processes" in store_side, store_side[-3000:]
    uninterrupted = reference("ddp", tmp_path / "ref")
    assert_same_training("ddp", out, uninterrupted)


# ---------------------------------------------------------------------------------------------- the store's machine
@pytest.mark.timeout(300)
def test_losing_the_machine_that_holds_the_store_ends_the_others_with_one_line(tmp_path):
    """torch's c10d store lives on the main machine: the others cannot re-form without it, and say so."""
    out, liveness = tmp_path / "store", 15.0
    with two_machines("store", "ddp", out, "--liveness_timeout", str(liveness), steps=4) as machines:
        killed = time.time()
        machines[0].kill()
        code = machines[1].wait(120)
        stopped = time.time() - killed
    log = machines[1].log.read_text()
    assert code != 0, log[-3000:]
    assert ("could not reach the elastic run's rendezvous store" in log
            or "lost its rendezvous store" in log), log[-3000:]
    assert stopped <= liveness + 10.0, f"machine 1 stopped {stopped:.1f} s after the store's machine was lost"
