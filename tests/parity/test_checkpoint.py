"""The folder `save_state` writes (matrix scenario "resume", saved after 3 steps): same files, same values.

hasten may add files of its own where they serve a documented improvement
that leaves a fault-free run's numbers alone (``ALLOWED_EXTRA``); every file
Accelerate writes must be there under the same name, holding the same
values (the training up to the save is compared step by step elsewhere).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from .harness import HASTEN, PEER, Runs

PROCESSES = [pytest.param(1, id="1p"), pytest.param(2, id="2p", marks=pytest.mark.multiprocess)]
# A test may start several runs (each under its own, shorter, kill-the-group timeout in harness.Runs).
pytestmark = [pytest.mark.parity, pytest.mark.timeout(1200)]

# Files hasten writes beside Accelerate's, and why they may stay (DESIGN.md: atomic checkpoints, exact resume).
ALLOWED_EXTRA = {
    r"hasten_checkpoint\.json": "the manifest hasten's atomic commit writes last",
    r"sampler(_\d+)?\.bin": "each prepared loader's position, for hasten's exact resume",
}


def files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def unexplained_extra(theirs: set[str], ours: set[str]) -> list[str]:
    """Files only hasten wrote that no entry of ``ALLOWED_EXTRA`` explains."""
    return sorted(n for n in ours - theirs if not any(re.fullmatch(p, Path(n).name) for p in ALLOWED_EXTRA))


def read(path: Path) -> Any:
    if path.suffix == ".safetensors":
        return load_file(path)
    if path.suffix in (".bin", ".pkl", ".pt"):
        return torch.load(path, weights_only=False)  # files this test's own runs just wrote
    return path.read_bytes()


def first_unequal(a: Any, b: Any, where: str = "") -> str | None:
    """Where two loaded values first differ (tensors bit for bit, with dtype), or None when equal.

    One representation difference is accepted: numpy's RNG key, an ndarray
    in Accelerate's ``random_states_<i>.pkl``, is an int64 tensor of the same
    numbers in hasten's, so that the file loads with ``weights_only=True``
    (Accelerate's needs full unpickling); ``numpy.random.set_state`` takes
    either, so both libraries' ``load_state`` restore the same stream.
    """
    if isinstance(a, np.ndarray) and isinstance(b, torch.Tensor):
        same_numbers = a.shape == tuple(b.shape) and np.array_equal(a.astype(np.int64), b.numpy())
        return None if same_numbers else f"{where}: numpy RNG key differs"
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{where}: {type(a).__name__} != {type(b).__name__}"
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{where}: {a.dtype}{list(a.shape)} != {b.dtype}{list(b.shape)}"
        if not torch.equal(a, b):
            gap = (a.double() - b.double()).abs().max().item() if a.is_floating_point() else "n/a"
            return f"{where}: tensors differ (max |diff| {gap})"
        return None
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return None if np.array_equal(a, b) else f"{where}: arrays differ"
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return f"{where}: keys {sorted(map(str, a))} != {sorted(map(str, b))}"
        for k in a:
            found = first_unequal(a[k], b[k], f"{where}[{k!r}]")
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_unequal(x, y, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{where}: {a!r:.120} != {b!r:.120}"


def checkpoints(runs: Runs, nproc: int) -> tuple[Path, Path]:
    peer, ours = runs.matrix(PEER, nproc), runs.matrix(HASTEN, nproc)
    peer.check(), ours.check()
    folders = peer.out / "ckpt" / "resume", ours.out / "ckpt" / "resume"
    assert folders[0].is_dir(), f"Accelerate wrote no checkpoint at {folders[0]}"
    assert folders[1].is_dir(), f"hasten wrote no checkpoint at {folders[1]}: {ours.of('error', 'resume')}"
    return folders


@pytest.mark.parametrize("nproc", PROCESSES)
def test_same_file_names(runs: Runs, nproc: int) -> None:
    theirs, ours = (files(f) for f in checkpoints(runs, nproc))
    assert not theirs - ours, f"hasten's save_state lacks Accelerate's files {sorted(theirs - ours)}"
    unexplained = unexplained_extra(theirs, ours)
    assert not unexplained, f"hasten's save_state writes files Accelerate does not: {sorted(unexplained)}"


@pytest.mark.parametrize("nproc", PROCESSES)
def test_same_values(runs: Runs, nproc: int) -> None:
    """Model, optimizer, scheduler and every rank's RNG states: equal to Accelerate's, key for key."""
    theirs, ours = checkpoints(runs, nproc)
    problems = []
    for name in sorted(files(theirs)):
        if not (ours / name).exists():
            problems.append(f"{name}: missing")
            continue
        found = first_unequal(read(theirs / name), read(ours / name))
        if found:
            problems.append(f"{name}{found}")
    if problems:
        pytest.fail(f"{nproc} process(es), checkpoint values differ from Accelerate's:\n" + "\n".join(problems),
                    pytrace=False)
