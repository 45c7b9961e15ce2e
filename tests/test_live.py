"""Live recovery end to end, through `hasten launch --num_machines 1:2 --elastic_recovery live` on this host
(loopback): two "machines" of tests/scripts/live_train.py train one run under torchft's lighthouse (in machine 0's
launcher). Machine 1 is stopped with SIGTERM (a graceful leave at the next step boundary), started again, SIGKILLed
inside a step and started again; with two processes a machine the same; and both machines are SIGKILLed at once, then
resume from the newest periodic checkpoint. The survivors never restart, commit again within seconds, no optimizer step
is trained twice (but the steps since the checkpoint when every machine is lost), every sample once, and they end at
the parameters of an uninterrupted run at the same global batch (MAX machines)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hasten.process.launch_spec import SPEC_ENV_VAR, LaunchSpec

SCRIPT = Path(__file__).parent / "scripts" / "live_train.py"
SRC = Path(__file__).resolve().parents[1] / "src"
SAMPLES = "4096"  # 128 optimizer steps of 4 micro-batches of 8: room for a stop, a return, a kill, a return
ELASTIC = {"min_processes": 1, "max_processes": 2, "processes_per_machine": 1}


def _env(out: Path, spec: LaunchSpec, **extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, "OUT": str(out), SPEC_ENV_VAR: spec.to_env()[SPEC_ENV_VAR],
            "RUST_LOG": "warn", "SAMPLES": SAMPLES, **extra}


def _start(out: Path, name: str, spec: LaunchSpec, **extra: str) -> tuple[subprocess.Popen, Path]:
    log = out / f"{name}.log"
    process = subprocess.Popen([sys.executable, str(SCRIPT)], env=_env(out, spec, **extra), stdout=log.open("w"),
                               stderr=subprocess.STDOUT, start_new_session=True)
    return process, log


def _steps(log: Path) -> list[tuple[float, int, int, bool, int, list[int]]]:
    """(time, pid, optimizer steps, committed, P, sample ids) per step attempt."""
    rows = []
    for line in log.read_text().splitlines():
        if line.startswith("STEP "):
            _, t, pid, steps, committed, processes, ids = line.split(" ")[:7]
            rows.append((float(t), int(pid), int(steps), committed == "1", int(processes), list(map(int, ids.split(",")))))
    return rows


def _learning_rates(*logs: Path) -> dict[int, set[str]]:
    """The learning rates each committed optimizer step left (after its scheduler step), over `logs`."""
    rates: dict[int, set[str]] = {}
    for log in logs:
        for line in log.read_text().splitlines():
            parts = line.split(" ")
            if line.startswith("STEP ") and parts[4] == "1":
                rates.setdefault(int(parts[3]), set()).add(parts[7])
    return rates


def _committed_samples(*logs: Path) -> dict[int, list[int]]:
    """The sample ids of each committed optimizer step over `logs`; no process committed one step twice."""
    by_step: dict[int, list[int]] = {}
    for log in logs:
        seen = [(pid, s) for _, pid, s, c, _, _ in _steps(log) if c]
        assert len(seen) == len(set(seen)), f"{log.name}: a process committed one optimizer step twice"
        for _, _, s, c, _, ids in _steps(log):
            if c:
                by_step.setdefault(s, []).extend(ids)
    return by_step


def _against(uninterrupted, out: Path, *logs: Path) -> tuple[dict[int, list[int]], list[int], list[float]]:
    """The run's samples per committed step, the steps whose samples differ from the uninterrupted run's, and each
    machine's final parameters' relative difference from the uninterrupted run's."""
    ref_steps, ref_final, _ = uninterrupted
    by_step = _committed_samples(*logs)
    differing = [s for s, ids in by_step.items() if sorted(ids) != ref_steps.get(s)]
    errors = [_relative(torch.load(path), ref_final) for path in sorted(out.glob("final_*.pt"))]
    return by_step, differing, errors


def _wait(condition, timeout: float, what: str, logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in logs if log.exists())
            pytest.fail(f"timed out after {timeout}s waiting for {what}\n{tails}")
        time.sleep(0.05)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The uninterrupted run: one process dealing all M = 2 x 2 micro-batches of each step (no live group); its
    samples per committed optimizer step and its final parameters."""
    return _reference(tmp_path_factory, ELASTIC)


@pytest.fixture(scope="module")
def uninterrupted_at_4(tmp_path_factory):
    """The uninterrupted run of 2 machines x 2 processes: one process dealing all M = 4 x 2 micro-batches a step."""
    return _reference(tmp_path_factory, {**ELASTIC, "max_processes": 4})


def _reference(tmp_path_factory, elastic: dict) -> tuple[dict[int, list[int]], torch.Tensor, dict[int, set[str]]]:
    os.environ.setdefault("RUST_LOG", "warn")  # before torchft is imported: the in-process lighthouse's INFO lines
    pytest.importorskip("torchft")
    ref_dir = tmp_path_factory.mktemp("ref")
    reference, ref_log = _start(ref_dir, "ref", LaunchSpec(elastic=elastic))
    try:
        assert reference.wait(timeout=120) == 0, ref_log.read_text()[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(reference.pid, signal.SIGKILL)
    ref_steps = {steps: sorted(ids) for _, _, steps, committed, _, ids in _steps(ref_log) if committed}
    return ref_steps, torch.load(next(ref_dir.glob("final_*.pt"))), _learning_rates(ref_log)


MARK = "HASTEN_TEST_LIVE_MACHINE"  # in the environment of every process of one "machine": what the kill looks for


def _launch(out: Path, name: str, rank: int, port: int, mark: str, per_machine: int = 1, main_ip: str = "127.0.0.1",
            prefix: tuple[str, ...] = (), flags: tuple[str, ...] = (), **extra: str) -> tuple[subprocess.Popen, Path]:
    """`hasten launch --elastic_recovery live` of one machine of two (on this host's loopback, or with `prefix` in a
    network namespace of its own, `main_ip` machine 0's address)."""
    log = out / f"{name}.log"
    env = _env(out, LaunchSpec(), **{MARK: mark, **extra})
    env.pop(SPEC_ENV_VAR)  # the launcher makes the spec
    command = [*prefix, sys.executable, "-m", "hasten", "launch", "--cpu", "--num_machines", "1:2", "--num_processes",
               str(2 * per_machine),
               "--machine_rank", str(rank), "--main_process_ip", main_ip, "--main_process_port", str(port),
               "--elastic_recovery", "live", *flags, str(SCRIPT)]
    process = subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                               start_new_session=True)
    return process, log


def _kill_machine(mark: str) -> int:
    """SIGKILL every process whose environment holds `MARK=mark` (the machine's launcher, agent and worker)."""
    needle, killed = f"{MARK}={mark}".encode(), 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    os.kill(int(entry.name), signal.SIGKILL)
                    killed += 1
    return killed


@contextlib.contextmanager
def _machines(tmp_path: Path):
    """(port, each machine's mark, the launchers started): every process of both machines is SIGKILLed at the end."""
    from hasten.launch.plan import find_free_port

    marks = [f"{tmp_path}/machine{rank}" for rank in (0, 1)]
    processes: list[subprocess.Popen] = []
    try:
        yield find_free_port(), marks, processes
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        for mark in marks:
            _kill_machine(mark)


def _committed_in_pair(log: Path, after: float = 0.0, count: int = 1, per_machine: int = 1) -> bool:
    return len([t for t, _, _, c, p, _ in _steps(log) if c and p == 2 * per_machine and t > after]) >= count


@pytest.mark.timeout(240)
def test_losing_the_lighthouses_machine_ends_the_others_with_one_line_within_the_liveness_limit(tmp_path):
    """Machine 0's launcher holds the lighthouse: without it no group forms, so machine 1 stops within
    --liveness_timeout, saying why in one line, its processes ended (as the restart path's machines stop when the
    rendezvous store's machine is lost)."""
    limit = 8.0
    flags = ("--liveness_timeout", str(limit))
    with _machines(tmp_path) as (port, marks, processes):
        holder, log0 = _launch(tmp_path, "machine0", 0, port, marks[0], flags=flags, STEP_SLEEP="0.1")
        other, log1 = _launch(tmp_path, "machine1", 1, port, marks[1], flags=flags, STEP_SLEEP="0.1")
        processes += [holder, other]
        _wait(lambda: _committed_in_pair(log1, count=3), 180, "machine 1 to train in a group of 2", [log0, log1])
        assert _kill_machine(marks[0]) >= 2, "machine 0's launcher and worker were not found"
        killed = time.time()
        code = other.wait(timeout=limit + 60)
        stopped = time.time() - killed
        left = _kill_machine(marks[1])
    text = log1.read_text()
    line = "could not reach the live run's lighthouse"
    print(f"\nlighthouse's machine SIGKILLed: machine 1 stopped {stopped:.1f} s later (--liveness_timeout {limit:g})")
    assert code == 1 and text.count(line) == 1 and "Traceback" not in text, text[-3000:]
    assert stopped <= limit + 10.0 and left == 0  # (no process of machine 1 outlived its launcher)


@pytest.mark.timeout(400)
def test_hasten_launch_elastic_recovery_live_survives_a_stopped_and_a_killed_machine(tmp_path, uninterrupted):
    """The same run through `hasten launch --num_machines 1:2 --elastic_recovery live`: machine 0's launcher holds the
    lighthouse; machine 1's launcher gets SIGTERM inside a step (a graceful leave: it finishes the step, leaves at the
    boundary, exits with 75), its command is started again, then its launcher and worker are SIGKILLed inside a step
    and its command is started again."""
    from hasten.process.launch_spec import EXIT_PREEMPTED

    ref_steps, _, ref_rates = uninterrupted
    with _machines(tmp_path) as (port, marks, processes):
        survivor, log0 = _launch(tmp_path, "machine0", 0, port, marks[0], STEP_SLEEP="0.15")
        victim, log1 = _launch(tmp_path, "machine1", 1, port, marks[1], STEP_SLEEP="0.15")
        processes += [survivor, victim]
        _wait(lambda: any(s >= 10 and p == 2 for _, _, s, c, p, _ in _steps(log1) if c), 180,
              "machine 1 to commit step 10 in a group of 2", [log0, log1])
        time.sleep(0.05)  # into the next step (its pause before the synchronising backward is 0.15 s)
        victim.send_signal(signal.SIGTERM)  # the launcher only, as a scheduler's stop does
        stopped_at = time.time()
        assert victim.wait(timeout=60) == EXIT_PREEMPTED, log1.read_text()[-3000:]
        left_line = [line for line in log1.read_text().splitlines() if "left the live run on SIGTERM" in line]
        time.sleep(1.0)
        returned, log1b = _launch(tmp_path, "machine1-again", 1, port, marks[1], STEP_SLEEP="0.15")
        returned_at = time.time()
        processes.append(returned)
        _wait(lambda: _committed_in_pair(log1b, count=3), 120, "machine 1 to train in a group of 2 again",
              [log0, log1b])
        time.sleep(0.05)
        killed = _kill_machine(marks[1])
        killed_at = time.time()
        assert killed >= 2, "machine 1's launcher and worker were not found"  # (launcher+agent, worker, guardian)
        returned.wait(timeout=30)
        time.sleep(1.0)
        joiner, log1c = _launch(tmp_path, "machine1-third", 1, port, marks[1], STEP_SLEEP="0.15")
        restarted_at = time.time()
        processes.append(joiner)
        _wait(lambda: "DONE" in log0.read_text() and "DONE" in log1c.read_text(), 240, "both machines to finish",
              [log0, log1b, log1c])
        assert survivor.wait(timeout=60) == 0, log0.read_text()[-3000:]
        assert joiner.wait(timeout=60) == 0, log1c.read_text()[-3000:]

        rows0 = _steps(log0)
        # the survivor's worker is the process it was: one start, one pid in all its lines
        starts = [line.split() for line in log0.read_text().splitlines() if line.startswith("START ")]
        assert len(starts) == 1 and {pid for _, pid, *_ in rows0} == {int(starts[0][2])}
        committed0 = [t for t, _, _, c, _, _ in rows0 if c]
        after_stop = next(t for t in committed0 if t > stopped_at) - stopped_at
        after_kill = next(t for t in committed0 if t > killed_at) - killed_at
        failed_stop = [s for t, _, s, c, _, _ in rows0 if not c and stopped_at < t < returned_at]
        failed_kill = [s for t, _, s, c, _, _ in rows0 if not c and t > killed_at]
        joined = [t - start for log, start in ((log1b, returned_at), (log1c, restarted_at))
                  for t in [next((t for t, _, _, c, p, _ in _steps(log) if c and p == 2), float("nan"))]]
        by_step, differing, errors = _against(uninterrupted, tmp_path, log0, log1, log1b, log1c)
        trained = sorted(i for ids in by_step.values() for i in ids)
        print(f"\nhasten launch --elastic_recovery live: SIGTERM -> survivor's next commit +{after_stop:.2f} s, failed "
              f"attempts {len(failed_stop)}; SIGKILL ({killed} processes) -> +{after_kill:.2f} s, failed attempts "
              f"{len(failed_kill)} (steps {failed_kill}); machine 1 back in a group of 2 "
              f"+{joined[0]:.2f} s / +{joined[1]:.2f} s after its command; committed steps {len(by_step)} of "
              f"{len(ref_steps)}; steps whose samples differ: {differing}; samples trained {len(trained)} "
              f"({len(set(trained))} distinct); final relative error {', '.join(f'{e:.2e}' for e in errors)}")
        assert left_line, f"machine 1 did not say it left:\n{log1.read_text()[-3000:]}"
        for log in (log0, log1b, log1c):  # torchft's CPU-build warning at each change, its pytree one at each heal,
            text = log.read_text()        # its traceback when a peer is lost inside a step: none
            assert "flight recorder" not in text and "LeafSpec" not in text and "Traceback" not in text, text[-3000:]
        assert not failed_stop, "the graceful leave failed a step attempt of the survivor"
        assert after_stop <= 5.0 and after_kill <= 5.0
        assert sorted(by_step) == sorted(ref_steps) and not differing
        assert _learning_rates(log0, log1, log1b, log1c) == ref_rates  # the LR of every optimizer step, every process
        assert len(trained) == len(set(trained)) == sum(len(ids) for ids in ref_steps.values())
        assert len(errors) == 2 and max(errors) <= 1e-5
        assert max(joined) <= 5.0, f"machine 1 joined {joined} s after its command"


@pytest.mark.timeout(300)
def test_two_hosts_recover_and_heal_across_their_link(tmp_path, uninterrupted):
    """Machines on two hosts (network namespaces joined by a veth pair, each with its own address, machine 0's the main
    one): machine 1 SIGKILLed inside a step and started again heals from machine 0 over the link. (Each machine's
    store and manager were advertised on loopback: the other machine connected to its own 127.0.0.1 and the run
    failed.)"""
    from machines import two_namespaces

    ref_steps, _, ref_rates = uninterrupted
    with two_namespaces("10.200.9") as made, _machines(tmp_path) as (port, marks, processes):
        hosts = [("ip", "netns", "exec", name) for name in made["namespaces"]]
        settings = dict(main_ip=made["addresses"][0], STEP_SLEEP="0.1")
        survivor, log0 = _launch(tmp_path, "machine0", 0, port, marks[0], prefix=hosts[0], **settings)
        victim, log1 = _launch(tmp_path, "machine1", 1, port, marks[1], prefix=hosts[1], **settings)
        processes += [survivor, victim]
        _wait(lambda: _committed_in_pair(log1, count=8), 180, "8 commits in a group of 2 across the link", [log0, log1])
        time.sleep(0.03)  # (inside a step)
        killed = _kill_machine(marks[1])
        killed_at = time.time()
        victim.wait(timeout=30)
        time.sleep(1.0)
        returned, log1b = _launch(tmp_path, "machine1-again", 1, port, marks[1], prefix=hosts[1], **settings)
        returned_at = time.time()
        processes.append(returned)
        _wait(lambda: "DONE" in log0.read_text() and "DONE" in log1b.read_text(), 240, "both machines to finish",
              [log0, log1b])
        assert survivor.wait(timeout=60) == 0, log0.read_text()[-3000:]
        assert returned.wait(timeout=60) == 0, log1b.read_text()[-3000:]

        committed0 = [t for t, _, _, c, _, _ in _steps(log0) if c]
        after_kill = next(t for t in committed0 if t > killed_at) - killed_at
        joined = next(t for t, _, _, c, p, _ in _steps(log1b) if c and p == 2) - returned_at
        by_step, differing, errors = _against(uninterrupted, tmp_path, log0, log1, log1b)
        print(f"\ntwo hosts: SIGKILL ({killed} processes) -> survivor's next commit +{after_kill:.2f} s; machine 1 back "
              f"in a group of 2 +{joined:.2f} s after its command; committed steps {len(by_step)} of {len(ref_steps)}; "
              f"steps whose samples differ: {differing}; final relative error {', '.join(f'{e:.2e}' for e in errors)}")
        assert "state received from a live peer" in log1b.read_text(), log1b.read_text()[-3000:]
        assert after_kill <= 5.0 and joined <= 5.0
        assert sorted(by_step) == sorted(ref_steps) and not differing
        assert _learning_rates(log0, log1, log1b) == ref_rates
        assert len(errors) == 2 and max(errors) <= 1e-5


@pytest.mark.timeout(300)
def test_losing_every_machine_at_once_resumes_from_the_newest_periodic_checkpoint(tmp_path, uninterrupted):
    """Both machines of a live run SIGKILLed inside a step (machine 0's lighthouse with them), then both commands
    started again: the run resumes from the newest periodic checkpoint (every 10 optimizer steps, written by the first
    machine of each quorum into the folder both share), redoes only the steps since it, and ends as the uninterrupted
    run."""
    from hasten.checkpointing.commit import read_manifest
    from hasten.checkpointing.project import latest_checkpoint

    ref_steps, _, ref_rates = uninterrupted
    project = tmp_path / "project"
    settings = dict(STEP_SLEEP="0.1", PROJECT=str(project), SAVE_EVERY="10")
    with _machines(tmp_path) as (port, marks, processes):
        first = [_launch(tmp_path, f"machine{rank}", rank, port, marks[rank], **settings) for rank in (0, 1)]
        processes += [process for process, _ in first]
        logs = [log for _, log in first]
        _wait(lambda: _committed_in_pair(logs[1], count=35), 180, "35 steps in a group of 2", logs)
        time.sleep(0.05)  # (inside a step)
        killed = _kill_machine(marks[0]) + _kill_machine(marks[1])
        for process in processes:
            process.wait(timeout=30)
        reached = max(s for log in logs for _, _, s, c, _, _ in _steps(log) if c)
        newest = latest_checkpoint(project / "checkpoints")
        assert newest is not None, "no periodic checkpoint was written"
        saved = int(read_manifest(newest)["run"]["optimizer_steps"])
        again = [_launch(tmp_path, f"machine{rank}-again", rank, port, marks[rank], **settings) for rank in (0, 1)]
        processes += [process for process, _ in again]
        logs_again = [log for _, log in again]
        _wait(lambda: all("DONE" in log.read_text() for log in logs_again), 180, "both machines to finish", logs_again)
        for process, log in again:
            assert process.wait(timeout=60) == 0, log.read_text()[-3000:]

        before = {s: ids for s, ids in _committed_samples(*logs).items() if s <= saved}
        after = _committed_samples(*logs_again)
        by_step = {**before, **after}
        differing = [s for s, ids in by_step.items() if sorted(ids) != ref_steps.get(s)]
        rates = {s: r for s, r in _learning_rates(*logs).items() if s <= saved} | _learning_rates(*logs_again)
        errors = [_relative(torch.load(path), uninterrupted[1]) for path in sorted(tmp_path.glob("final_*.pt"))]
        print(f"\nboth machines SIGKILLed ({killed} processes) at optimizer step {reached}: resumed from "
              f"{newest.name} (step {saved}) by both commands started again, {reached - saved} step(s) redone; committed "
              f"steps {len(by_step)} of {len(ref_steps)}; steps whose samples differ: {differing}; final relative "
              f"error {', '.join(f'{e:.2e}' for e in errors)}")
        # each command started again resumed from the folder's newest checkpoint when it started (machine 0 may
        # have written a newer one by the time a slower machine 1 reads the folder), one of them from `newest`
        resumed = [log.read_text() for log in logs_again]
        assert all(f"resumed from {project / 'checkpoints'}/checkpoint_" in text for text in resumed), resumed[-1][-3000:]
        assert any(f"resumed from {newest}." in text for text in resumed)
        assert min(after) == saved + 1 and 0 <= reached - saved <= 10  # only the steps since the checkpoint again
        assert sorted(by_step) == sorted(ref_steps) and not differing
        assert rates == ref_rates
        assert len(errors) == 2 and max(errors) <= 1e-5


@pytest.mark.timeout(400)
@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_two_processes_a_machine_survive_a_killed_and_a_stopped_machine(tmp_path, uninterrupted_at_4, engine):
    """2 machines x 2 processes (`--num_processes 4 --num_machines 1:2 --elastic_recovery live`): machine 1 SIGKILLed
    inside a step (its launcher, agent and both workers), started again, then stopped with SIGTERM (both its processes
    leave at the same step boundary). Machine 0's two processes never restart, and every committed step is the
    uninterrupted run's at 4 processes. Under FSDP2 each machine's two processes shard the model and the machines
    replicate it (HSDP): the returning machine's shards come from machine 0's."""
    from hasten.process.launch_spec import EXIT_PREEMPTED

    ref_steps, ref_final, ref_rates = uninterrupted_at_4
    with _machines(tmp_path) as (port, marks, processes):
        pace = tmp_path / "pace"  # the pause a step (below: slower while machine 1 rejoins, none once it left)
        pace.write_text("0.15")
        settings = dict(per_machine=2, STEP_SLEEP="0.15", ENGINE=engine, PACE_FILE=str(pace))
        survivor, log0 = _launch(tmp_path, "machine0", 0, port, marks[0], **settings)
        victim, log1 = _launch(tmp_path, "machine1", 1, port, marks[1], **settings)
        processes += [survivor, victim]
        _wait(lambda: _committed_in_pair(log1, count=16, per_machine=2), 180, "16 commits in a group of 4",
              [log0, log1])
        time.sleep(0.05)  # (inside a step)
        killed = _kill_machine(marks[1])
        killed_at = time.time()
        pace.write_text("0.4")  # 64 steps in all: a join slowed by a loaded machine (CI: ~10 s) still finds steps left
        victim.wait(timeout=30)
        time.sleep(1.0)
        returned, log1b = _launch(tmp_path, "machine1-again", 1, port, marks[1], **settings)
        returned_at = time.time()
        processes.append(returned)
        _wait(lambda: _committed_in_pair(log1b, count=6, per_machine=2), 120, "machine 1 back in a group of 4",
              [log0, log1b])
        time.sleep(0.05)
        returned.send_signal(signal.SIGTERM)
        stopped_at = time.time()
        assert returned.wait(timeout=60) == EXIT_PREEMPTED, log1b.read_text()[-3000:]
        pace.write_text("0")
        _wait(lambda: "DONE" in log0.read_text(), 240, "machine 0 to finish", [log0, log1b])
        assert survivor.wait(timeout=60) == 0, log0.read_text()[-3000:]

        rows0 = _steps(log0)
        assert log0.read_text().count("START ") == 2 and len({pid for _, pid, *_ in rows0}) == 2  # never restarted
        committed0 = [t for t, _, _, c, _, _ in rows0 if c]
        after_kill = next(t for t in committed0 if t > killed_at) - killed_at
        after_stop = next(t for t in committed0 if t > stopped_at) - stopped_at
        failed_stop = [s for t, _, s, c, _, _ in rows0 if not c and t > stopped_at]
        joined = next(t for t, _, _, c, p, _ in _steps(log1b) if c and p == 4) - returned_at
        by_step = _committed_samples(log0, log1, log1b)
        differing = [s for s, ids in by_step.items() if sorted(ids) != ref_steps.get(s)]
        errors = [_relative(torch.load(path), ref_final) for path in sorted(tmp_path.glob("final_*.pt"))]
        print(f"\n2 machines x 2 processes, {engine}: SIGKILL ({killed} processes) -> survivors' next commit +{after_kill:.2f} s; "
              f"machine 1 back in a group of 4 +{joined:.2f} s after its command; SIGTERM -> +{after_stop:.2f} s, "
              f"failed attempts {len(failed_stop)}; committed steps {len(by_step)} of {len(ref_steps)}; steps whose "
              f"samples differ: {differing}; final relative error {', '.join(f'{e:.2e}' for e in errors)}")
        assert "Traceback" not in log0.read_text(), log0.read_text()[-3000:]  # (torchft's, at the kill: one line)
        assert after_kill <= 5.0 and after_stop <= 5.0 and not failed_stop
        assert sorted(by_step) == sorted(ref_steps) and not differing
        assert _learning_rates(log0, log1, log1b) == ref_rates
        assert len(errors) == (2 if engine == "ddp" else 1) and max(errors) <= 1e-5  # (FSDP2: its main process)
