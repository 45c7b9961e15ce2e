"""The matrix script under Accelerate and under hasten, 1 and 2 processes: every step's records must be equal.

Equal means bit-identical: both libraries run the same torch operations on
the same CPU (the same DDP all-reduce over gloo on 2 processes), so losses,
learning rates and norms are compared as ``float.hex`` strings. A step
record holds the dataset indices of the rank's batch (``idx``), a digest of
the global torch RNG before the step (``rng``: dropout's stream), ``loss``,
``lr``, ``sync_gradients``, ``end_of_dataloader``, the norm
``clip_grad_norm_`` returned and whether the optimizer step was skipped.
"""

from __future__ import annotations

import pytest

from .harness import HASTEN, PEER, STEP_FIELDS, Run, Runs, as_uninterrupted, first_difference, scenario_names

SCENARIOS = scenario_names()
PROCESSES = [pytest.param(1, id="1p"), pytest.param(2, id="2p", marks=pytest.mark.multiprocess)]
# A test may start several runs (each under its own, shorter, kill-the-group timeout in harness.Runs).
pytestmark = [pytest.mark.parity, pytest.mark.timeout(1200)]


def _errors(run: Run, scenario: str, phase: str = "train") -> list[str]:
    return [f"{r['error']}  at  {' | '.join(r.get('where', []))}" for r in run.of("error", scenario, phase)]


def compare(runs: Runs, scenario: str, nproc: int, kind: str, fields: tuple[str, ...], phase: str = "train",
            checkpoints_of: str | None = None) -> None:
    """Fail with the first differing record of ``kind`` for ``scenario``, both values shown."""
    peer, ours = runs.matrix(PEER, nproc, phase), runs.matrix(HASTEN, nproc, phase, checkpoints_of)
    peer.check()
    where = f"{scenario!r} ({phase}) on {nproc} process(es)"
    if _errors(peer, scenario, phase):
        pytest.fail(f"{where} fails under Accelerate itself: {_errors(peer, scenario, phase)[0]}", pytrace=False)
    ours.check()
    if _errors(ours, scenario, phase):
        pytest.fail(f"{where}: hasten raised {_errors(ours, scenario, phase)[0]}", pytrace=False)
    expected = peer.of(kind, scenario, phase)
    assert expected, f"Accelerate wrote no {kind!r} record for {where}"
    difference = first_difference(expected, ours.of(kind, scenario, phase), fields)
    if difference is not None:
        pytest.fail(f"{where}, {kind} records:\n{difference}", pytrace=False)


@pytest.mark.parametrize("nproc", PROCESSES)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_training_steps(runs: Runs, scenario: str, nproc: int) -> None:
    """Per step: indices, RNG, loss, lr, sync flags, clip norm; then the final parameters."""
    compare(runs, scenario, nproc, "step", STEP_FIELDS)
    compare(runs, scenario, nproc, "final", ("params", "rng"))


@pytest.mark.parametrize("nproc", PROCESSES)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_gather_for_metrics(runs: Runs, scenario: str, nproc: int) -> None:
    """Per eval step (ragged last batch: 21 rows): the rows `gather_for_metrics` returned and their predictions."""
    compare(runs, scenario, nproc, "eval", ("rows", "preds"))


@pytest.mark.parametrize("nproc", PROCESSES)
def test_setup_facts(runs: Runs, nproc: int) -> None:
    """What a script reads after prepare: distributed type, precision, loader lengths, the RNG after prepare."""
    peer, ours = runs.matrix(PEER, nproc), runs.matrix(HASTEN, nproc)
    peer.check()
    # The reference must really be Accelerate on nproc processes (a wrong launch form runs 1 process silently).
    setups = peer.of("setup", "plain")
    assert sorted(r["r"] for r in setups) == list(range(nproc))
    expected = (nproc, "MULTI_CPU" if nproc > 1 else "NO")
    assert {(r["num_processes"], r["distributed_type"]) for r in setups} == {expected}
    ours.check()
    fields = ("distributed_type", "num_processes", "mixed_precision", "train_batches", "eval_batches", "rng")
    problems = []
    for scenario in SCENARIOS:
        difference = first_difference(peer.of("setup", scenario), ours.of("setup", scenario), fields)
        if difference:
            problems.append(f"{scenario}: {difference}")
    if problems:
        pytest.fail(f"{nproc} process(es), setup records differ:\n" + "\n".join(problems), pytrace=False)


@pytest.mark.parametrize("nproc", PROCESSES)
def test_reset_state_between_accelerators(runs: Runs, nproc: int) -> None:
    """`AcceleratorState._reset_state(True)`, `GradientState._reset_state()`: as Accelerate's test scripts call them."""
    ours = runs.matrix(HASTEN, nproc)
    ours.check()
    errors = sorted({r["error"] for r in ours.of("reset_error")})
    assert not errors, f"resetting the shared state between Accelerators raised under hasten: {errors}"
    assert not runs.matrix(PEER, nproc).of("reset_error")


@pytest.mark.parametrize("nproc", PROCESSES)
def test_resume_loads_what_accelerate_loads(runs: Runs, nproc: int) -> None:
    """After load_state from each library's own checkpoint: same weights, optimizer moments, lr and RNG."""
    compare(runs, "resume", nproc, "loaded", ("rng", "lr", "params", "moments"), phase="resume")


@pytest.mark.parametrize("nproc", PROCESSES)
def test_resume_is_exact(runs: Runs, nproc: int) -> None:
    """Resumed from its own checkpoint (load_state + skip_first_batches), hasten continues as if never stopped.

    This is compared with the uninterrupted run (equal under both libraries,
    see test_training_steps[resume]), not with Accelerate's own resume, which
    is not exact here: load_state puts the global torch RNG back to its state
    at the save, then the skipping DataLoader's new iteration draws torch's
    base seed from it (a draw the uninterrupted run made at the epoch's
    start), so dropout runs one draw ahead from there on; on one process the
    RandomSampler (no generator) also draws its permutation seed from that
    restored RNG, so the rest of the epoch visits other samples. hasten keeps
    its loaders' positions in its checkpoint and resumes exactly (DESIGN.md:
    exact resume); from Accelerate's checkpoint it continues exactly as
    Accelerate does (test_resume_from_an_accelerate_checkpoint).
    """
    uninterrupted, resumed = runs.matrix(PEER, nproc), runs.matrix(HASTEN, nproc, "resume")
    uninterrupted.check(), resumed.check()
    errors = _errors(resumed, "resume", "resume")
    if errors:
        pytest.fail(f"resume on {nproc} process(es): hasten raised {errors[0]}", pytrace=False)
    saved = uninterrupted.of("saved", "resume")[0]
    for kind, fields in (("step", STEP_FIELDS), ("eval", ("rows", "preds")), ("final", ("params", "rng"))):
        ours = as_uninterrupted(resumed.of(kind, "resume", "resume"), saved)
        expected = [r for r in uninterrupted.of(kind, "resume", "train")
                    if kind != "step" or (r["ep"], r["st"]) > (saved["ep"], saved["st"])]
        assert ours, f"hasten's resumed run wrote no {kind!r} record"
        difference = first_difference(expected, ours, fields)
        if difference is not None:
            pytest.fail(f"resume on {nproc} process(es), {kind} records (resumed vs never stopped):\n{difference}",
                        pytrace=False)


@pytest.mark.parametrize("nproc", PROCESSES)
def test_resume_from_an_accelerate_checkpoint(runs: Runs, nproc: int) -> None:
    """hasten's load_state reads the folder Accelerate's save_state wrote and continues as Accelerate does."""
    for kind, fields in (("loaded", ("rng", "lr", "params", "moments")), ("step", STEP_FIELDS),
                         ("eval", ("rows", "preds")), ("final", ("params", "rng"))):
        compare(runs, "resume", nproc, kind, fields, phase="resume", checkpoints_of=PEER)
