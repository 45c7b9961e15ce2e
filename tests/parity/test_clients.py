"""Client scripts written in the style of Hugging Face's examples: the same file under Accelerate and hasten.

- ``glue_client.py`` (transformers' run_glue_no_trainer style): MiniLM on a
  small CSV, linear schedule sized ``max_train_steps * num_processes``,
  accuracy through ``gather_for_metrics``.
- ``diffusers_client.py`` (diffusers' train_unconditional style):
  ``save_state`` inside ``if accelerator.is_main_process:``, save/load hooks
  behind ``accelerate.__version__ >= 0.16.0`` writing the model to ``unet/``,
  resume from a mid-run checkpoint.

Per step: the rows of each rank's batch, the RNG digest, loss and learning
rate (``float.hex``), the sync flags; bit-identical, as in the matrix.
"""

from __future__ import annotations

import pytest

from .harness import HASTEN, PEER, STEP_FIELDS, Run, Runs, first_difference
from .test_checkpoint import files, first_unequal, read, unexplained_extra

PROCESSES = [pytest.param(1, id="1p"), pytest.param(2, id="2p", marks=pytest.mark.multiprocess)]
pytestmark = pytest.mark.parity


def pair(runs: Runs, name: str, nproc: int, resume_from: str = "") -> tuple[Run, Run]:
    peer = runs.script(name, PEER, nproc, "--cpu", resume_from=resume_from)
    peer.check()
    ours = runs.script(name, HASTEN, nproc, "--cpu", resume_from=resume_from)
    ours.check()
    return peer, ours


def same(peer: Run, ours: Run, kind: str, fields: tuple[str, ...]) -> None:
    expected = peer.of(kind)
    assert expected, f"Accelerate's {peer.name} wrote no {kind!r} record"
    difference = first_difference(expected, ours.of(kind), fields)
    if difference is not None:
        pytest.fail(f"{peer.name} on {peer.nproc} process(es), {kind} records:\n{difference}", pytrace=False)


@pytest.mark.parametrize("nproc", PROCESSES)
def test_glue_client_trains_the_same_steps(runs: Runs, nproc: int) -> None:
    peer, ours = pair(runs, "glue_client", nproc)
    same(peer, ours, "step", STEP_FIELDS)


@pytest.mark.parametrize("nproc", PROCESSES)
def test_glue_client_evaluates_the_same_rows(runs: Runs, nproc: int) -> None:
    """60 validation rows (a ragged last batch): gather_for_metrics returns each once, the accuracy is the same."""
    peer, ours = pair(runs, "glue_client", nproc)
    same(peer, ours, "eval", ("rows", "preds"))
    same(peer, ours, "metric", ("value", "samples"))
    assert all(r["samples"] == 60 for r in peer.of("metric"))


@pytest.mark.parametrize("nproc", PROCESSES)
def test_diffusers_client_trains_the_same_steps(runs: Runs, nproc: int) -> None:
    peer, ours = pair(runs, "diffusers_client", nproc)
    same(peer, ours, "step", STEP_FIELDS)
    same(peer, ours, "final", ("params",))


@pytest.mark.parametrize("nproc", PROCESSES)
def test_diffusers_client_checkpoints_like_accelerate(runs: Runs, nproc: int) -> None:
    """Saved by the main process alone (no hang), at the same steps, same files (model in unet/), same values."""
    peer, ours = pair(runs, "diffusers_client", nproc)
    same(peer, ours, "setup", ("hooks",))  # `accelerate.__version__ >= 0.16.0` registers the hooks under both
    same(peer, ours, "saved", ("path", "step"))
    problems = []
    for record in peer.of("saved"):
        theirs, mine = peer.out / record["path"], ours.out / record["path"]
        if not mine.is_dir():
            problems.append(f"{record['path']}: missing")
            continue
        missing = sorted(files(theirs) - files(mine))
        extra = unexplained_extra(files(theirs), files(mine))
        if missing or extra:
            problems.append(f"{record['path']}: lacks {missing}, adds {extra}")
            continue
        for name in sorted(files(theirs)):
            found = first_unequal(read(theirs / name), read(mine / name))
            if found:
                problems.append(f"{record['path']}/{name}{found}")
    if problems:
        pytest.fail(f"{nproc} process(es), checkpoints differ from Accelerate's:\n" + "\n".join(problems),
                    pytrace=False)


@pytest.mark.parametrize("nproc", PROCESSES)
def test_diffusers_client_resumes_like_accelerate(runs: Runs, nproc: int) -> None:
    """--resume_from_checkpoint checkpoint-4: the hooks load unet/, the skipped batches, every later step equal."""
    peer, ours = pair(runs, "diffusers_client", nproc, resume_from="checkpoint-4")
    same(peer, ours, "loaded", ("path", "lr"))
    same(peer, ours, "step", STEP_FIELDS)
    same(peer, ours, "final", ("params",))
