"""Client scripts written in the style of Hugging Face's examples: the same file under Accelerate and hasten.

- ``glue_client.py`` (transformers' run_glue_no_trainer style): MiniLM on a
  small CSV, linear schedule sized ``max_train_steps * num_processes``,
  accuracy through ``gather_for_metrics``.
- ``diffusers_client.py`` (diffusers' train_unconditional style):
  ``save_state`` inside ``if accelerator.is_main_process:``, save/load hooks
  behind ``accelerate.__version__ >= 0.16.0`` writing the model to ``unet/``
  with ``save_pretrained`` on the models they receive (as diffusers' hooks do),
  resume from a mid-run checkpoint; with ``--diffusers_unet``, diffusers' own
  ``UNet2DModel`` under the accelerate switch.

Per step: the rows of each rank's batch, the RNG digest, loss and learning
rate (``float.hex``), the sync flags; bit-identical, as in the matrix.
"""

from __future__ import annotations

import pytest

from .harness import HASTEN, PEER, STEP_FIELDS, Run, Runs, first_difference
from .test_checkpoint import files, first_unequal, read, unexplained_extra

PROCESSES = [pytest.param(1, id="1p"), pytest.param(2, id="2p", marks=pytest.mark.multiprocess)]
# A test may start several runs (each under its own, shorter, kill-the-group timeout in harness.Runs).
pytestmark = [pytest.mark.parity, pytest.mark.timeout(1200)]


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
    same_checkpoints(peer, ours)


def same_checkpoints(peer: Run, ours: Run) -> None:
    """The checkpoints each run saved: the same folders, files and values."""
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
        pytest.fail(f"{ours.name} on {ours.nproc} process(es), checkpoints differ from Accelerate's:\n"
                    + "\n".join(problems), pytrace=False)


@pytest.mark.multiprocess
def test_diffusers_unet_hooks_get_what_accelerate_hands_them(runs: Runs) -> None:
    """diffusers' own UNet2DModel, 2 processes, hooks as diffusers writes them (``model.save_pretrained`` on what
    they receive: the bare model under DDP, as Accelerate's ``_models`` holds it), unchanged under the switch:
    the same steps, checkpoints and resume from Accelerate's checkpoint as under Accelerate."""
    args = ("--cpu", "--diffusers_unet")
    peer = runs.script("diffusers_client", PEER, 2, *args)
    peer.check()
    ours = runs.script("diffusers_client", HASTEN, 2, *args, switch=True)
    ours.check()
    same(peer, ours, "step", STEP_FIELDS)
    same(peer, ours, "final", ("params",))
    same_checkpoints(peer, ours)
    assert (ours.out / "checkpoint-4" / "unet" / "diffusion_pytorch_model.safetensors").is_file()
    peer_resumed = runs.script("diffusers_client", PEER, 2, *args, resume_from="checkpoint-4")
    peer_resumed.check()
    ours_resumed = runs.script("diffusers_client", HASTEN, 2, *args, resume_from="checkpoint-4", checkpoints_of=PEER,
                               switch=True)
    ours_resumed.check()
    same(peer_resumed, ours_resumed, "loaded", ("path", "lr"))
    same(peer_resumed, ours_resumed, "step", STEP_FIELDS)
    same(peer_resumed, ours_resumed, "final", ("params",))


@pytest.mark.parametrize("nproc", PROCESSES)
def test_diffusers_client_resumes_exactly(runs: Runs, nproc: int) -> None:
    """--resume_from_checkpoint checkpoint-4 (loop over the loader, `continue` past the batches done): as never stopped.

    Compared with the uninterrupted run (equal under both libraries, see
    above), not with Accelerate's own resume, which is not exact here: its
    non-stateful loader restarts its shuffle from the generator state of
    `prepare`, so a resume in epoch 1 replays epoch 0's order (2 processes),
    and on one process the sampler draws its seed from the restored RNG.
    On 2 processes only the main process saved (the diffusers pattern), so
    no checkpoint holds rank 1's RNG (``random_states_1.pkl``), under either
    library: rank 1's noise and dropout cannot continue as never stopped, so
    there only the batches of every rank and rank 0's RNG are compared.
    """
    uninterrupted = runs.script("diffusers_client", PEER, nproc, "--cpu")
    uninterrupted.check()
    resumed = runs.script("diffusers_client", HASTEN, nproc, "--cpu", resume_from="checkpoint-4")
    resumed.check()
    steps = resumed.of("step")
    assert steps, "hasten's resumed run wrote no step record"
    first = min((r["ep"], r["st"]) for r in steps)
    expected = [r for r in uninterrupted.of("step") if (r["ep"], r["st"]) >= first]
    checks = [("step", expected, steps, STEP_FIELDS), ("final", uninterrupted.of("final"), resumed.of("final"),
                                                       ("params",))]
    if nproc > 1:
        checks = [("step", expected, steps, ("idx",)),
                  ("step (rank 0)", [r for r in expected if r["r"] == 0], [r for r in steps if r["r"] == 0],
                   ("rng", "sync", "eod"))]
    for kind, theirs, ours, fields in checks:
        difference = first_difference(theirs, ours, fields)
        if difference is not None:
            pytest.fail(f"diffusers_client on {nproc} process(es), {kind} records (resumed vs never stopped):\n"
                        f"{difference}", pytrace=False)


@pytest.mark.parametrize("nproc", PROCESSES)
def test_diffusers_client_resumes_from_an_accelerate_checkpoint(runs: Runs, nproc: int) -> None:
    """hasten loads the folder Accelerate's main process wrote (model in unet/ via the hooks) and goes on as it does."""
    peer = runs.script("diffusers_client", PEER, nproc, "--cpu", resume_from="checkpoint-4")
    peer.check()
    ours = runs.script("diffusers_client", HASTEN, nproc, "--cpu", resume_from="checkpoint-4", checkpoints_of=PEER)
    ours.check()
    same(peer, ours, "loaded", ("path", "lr"))
    same(peer, ours, "step", STEP_FIELDS)
    same(peer, ours, "final", ("params",))
