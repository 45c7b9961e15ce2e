"""Run one script under Accelerate (the peer) and under hasten (imports rewritten), read and compare their records.

The scripts in ``scripts/`` are written for Accelerate 1.16 and append one
JSON line per step to ``OUT/records_rank<R>.jsonl``. Here a script is
started the way a user starts it (plain ``python`` on one process;
``accelerate launch --multi_gpu`` / ``hasten launch`` on several), its
records are read back, and two runs are compared record by record.

The peer's results depend only on the script, its arguments and the
installed versions, so they are cached (``~/.cache/hasten-parity``; set
``HASTEN_PARITY_CACHE=0`` to always rerun): iterating on hasten reruns only
hasten.

Example:
    >>> steps = [{"k": "step", "s": "a", "r": 0, "ph": "train", "ep": 0, "st": 0, "loss": "0x1.0p+0"}]
    >>> first_difference(steps, steps, ("loss",)) is None
    True
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import pytest

from conftest import run_with_timeout

from .rewrite import rewrite_file

SCRIPTS = Path(__file__).parent / "scripts"
EXAMPLES_DATA = Path(__file__).resolve().parents[2] / "examples" / "data"
PEER = "accelerate"
HASTEN = "hasten"
# Seconds a run may take before its process group is killed: a few times what it needs here when it works,
# below the parity tests' pytest timeout, so a hang costs one run's limit and leaves no process behind.
CLIENT_TIMEOUTS = {"glue_client": 180, "diffusers_client": 90, "trainer_client": 180}
STEP_FIELDS = ("idx", "rng", "loss", "lr", "sync", "eod", "norm", "skipped")


def scenario_names(script: Path = SCRIPTS / "matrix.py") -> list[str]:
    """The keys of the script's ``SCENARIOS`` dict, read without importing it (it imports accelerate)."""
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "SCENARIOS":
            return [key.value for key in node.value.keys]
    raise LookupError(f"{script} defines no SCENARIOS dict")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(lib: str, script: Path, nproc: int, args: Iterable[str], switch: bool = False) -> list[str]:
    """The command line a user would type: plain python on 1 process, the library's launcher on several.

    ``switch``: a script that never imports accelerate itself (it uses a
    library built on it); hasten runs it unchanged with ``hasten launch
    --as-accelerate``, on 1 process too.
    """
    if lib == HASTEN and switch:
        several = ["--num_processes", str(nproc), "--main_process_port", str(free_port())] if nproc > 1 else []
        return [sys.executable, "-m", "hasten", "launch", "--as-accelerate", *several, str(script), *args]
    if nproc == 1:
        return [sys.executable, str(script), *args]
    port = str(free_port())
    if lib == PEER:  # the only form that starts N CPU processes under the peer (FACTS.md: "peer launch on CPU")
        launcher = ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_machines", "1",
                    "--mixed_precision", "no", "--dynamo_backend", "no"]
    else:
        launcher = ["-m", "hasten", "launch"]
    return [sys.executable, *launcher, "--num_processes", str(nproc), "--main_process_port", port,
            str(script), *args]


@dataclass
class Run:
    """One finished run: its records (each with its rank as ``r``), output folder and what it printed."""

    lib: str
    name: str
    nproc: int
    out: Path
    returncode: int | None = None
    output: str = ""
    records: list[dict[str, Any]] = field(default_factory=list)
    failure: str | None = None  # set when the run did not finish on every rank
    key: str = ""  # the peer cache's key for this run ("" when not cached)

    def of(self, kind: str, scenario: str | None = None, phase: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.records if r["k"] == kind and (scenario is None or r.get("s") == scenario)
                and (phase is None or r.get("ph") == phase)]

    def check(self) -> None:
        """Fail the calling test when this run did not complete (a hang, a crash) instead of comparing nothing."""
        if self.failure:
            pytest.fail(f"{self.lib} {self.name} on {self.nproc} process(es) did not finish: {self.failure}",
                        pytrace=False)


def read_records(out: Path) -> list[dict[str, Any]]:
    records = []
    for path in sorted(out.glob("records_rank*.jsonl")):
        rank = int(path.stem.removeprefix("records_rank"))
        records += [{**json.loads(line), "r": rank} for line in path.read_text().splitlines() if line.strip()]
    return records


def all_ranks_done(out: Path, nproc: int) -> bool:
    """Whether every rank's records end with "done" (read while the run may still be writing them)."""
    def ends_done(path: Path) -> bool:
        lines = path.read_text().rstrip().splitlines()
        try:
            return bool(lines) and json.loads(lines[-1]).get("k") == "done"
        except ValueError:  # a line still being written
            return False

    files = list(out.glob("records_rank*.jsonl")) if out.exists() else []
    return len(files) == nproc and all(ends_done(path) for path in files)


def _cache_key(script: Path, nproc: int, args: list[str], parent: str) -> str:
    import importlib.metadata as md  # versions read from metadata: this process never imports accelerate

    text = json.dumps([script.read_text(), nproc, args, parent, md.version("accelerate"), md.version("torch")])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _cache_dir() -> Path | None:
    setting = os.environ.get("HASTEN_PARITY_CACHE", str(Path.home() / ".cache" / "hasten-parity"))
    return None if setting in ("", "0") else Path(setting)


def peer_entry(script: Path, nproc: int, args: list[str], parent: str = "") -> Path | None:
    """The cache folder of a peer run of ``script`` (None when the cache is off: HASTEN_PARITY_CACHE=0)."""
    cache = _cache_dir()
    return None if cache is None else cache / _cache_key(script, nproc, args, parent)


def restore_cached(entry: Path | None, out: Path) -> bool:
    """Copy a complete cached peer run into ``out``; False when there is none."""
    if entry is None or not (entry / "complete").exists():
        return False
    shutil.copytree(entry / "out", out)
    return True


def cached_output(entry: Path | None) -> str | None:
    """The console output of a complete cached peer run (None when there is none)."""
    if entry is None or not (entry / "complete").exists():
        return None
    return (entry / "output.txt").read_text()


def store_cached(entry: Path | None, out: Path | None, output: str = "") -> None:
    """Keep a finished peer run's folder (`out`; None: a run that wrote none) and console output for the next runs
    (nothing when the cache is off)."""
    if entry is None:
        return
    shutil.rmtree(entry, ignore_errors=True)
    if out is not None:
        shutil.copytree(out, entry / "out")
    entry.mkdir(parents=True, exist_ok=True)
    (entry / "output.txt").write_text(output)
    (entry / "complete").write_text("")


def run_script(lib: str, script: Path, nproc: int, out: Path, args: Iterable[str] = (), name: str = "",
               timeout: float = 240, env: dict[str, str] | None = None, parent: "Run | None" = None,
               switch: bool = False) -> Run:
    """Run ``script`` (written for Accelerate) under ``lib`` on ``nproc`` processes; ``--out OUT`` is appended.

    ``switch``: the script is run unchanged under hasten, through the
    accelerate switch (see `command`), instead of with its imports rewritten.

    A peer run is cached (see the module doc). Paths in ``args`` under
    ``out.parent`` enter its key by their relative name; a run that reads
    another run's folder names that run as ``parent`` (its key joins).
    """
    args = [*args, "--out", str(out)]
    run = Run(lib, name or script.stem, nproc, out)
    entry = None
    if lib == PEER and (parent is None or parent.key):
        relative = [a.replace(str(out.parent), "<runs>") for a in args]
        entry = peer_entry(script, nproc, relative, parent.key if parent else "")
        if entry is not None:
            run.key = entry.name
        if restore_cached(entry, out):
            run.returncode, run.output = 0, (entry / "output.txt").read_text()
            run.records = read_records(out)
            return run
    if lib == HASTEN and not switch:
        script = rewrite_file(script, out.parent / f"{out.name}_{script.name}")
    run_env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "OMP_NUM_THREADS": "1", "PARITY_EXAMPLES_DATA": str(EXAMPLES_DATA), **(env or {})}
    # Parity is about defaults: no precision from the caller's shell, and not the opt-in real fp16 on the CPU
    # that tests/conftest.py turns on for hasten's own tests (Accelerate trains CPU "fp16" in full precision).
    for name in ("ACCELERATE_MIXED_PRECISION", "HASTEN_CPU_FP16"):
        run_env.pop(name, None)
    try:
        # Accelerate's ranks can hang in torch's exit (seen: ~ProcessGroupGloo when DDP's reducer is freed, on a loaded
        # machine): once every rank wrote "done", such a run is killed after the grace and kept; hasten's never are.
        peer = lib == PEER
        done = (lambda: all_ranks_done(out, nproc)) if peer else None
        result = run_with_timeout(command(lib, script, nproc, args, switch), timeout, run_env, leftovers_fail=not peer,
                                  finished=done)
    except pytest.fail.Exception as timed_out:  # kept, so every test using this run reports it (once started)
        run.failure, run.key = str(timed_out)[-4000:], ""
        run.records = read_records(out) if out.exists() else []
        return run
    run.returncode, run.output = result.returncode, (result.stdout + result.stderr)
    run.records = read_records(out) if out.exists() else []
    finished = sum(1 for r in run.records if r["k"] == "done")
    if finished != nproc:  # an unfinished run is neither cached nor a parent in the cache
        run.failure, run.key = (f"exit code {result.returncode}, {finished} of {nproc} ranks finished; "
                                f"output tail:\n{run.output[-4000:]}"), ""
    else:
        store_cached(entry, out, run.output)
    return run


class Runs:
    """Runs started on first use and kept, so `-k one_scenario` costs the same launches as the whole suite."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[tuple, Run] = {}

    def matrix(self, lib: str, nproc: int, phase: str = "train", checkpoints_of: str | None = None) -> Run:
        """The matrix script's run; ``phase="resume"`` loads the checkpoints of ``checkpoints_of``'s train run."""
        checkpoints_of = (checkpoints_of or lib) if phase == "resume" else None
        key = ("matrix", lib, nproc, phase, checkpoints_of)
        if key not in self.done:
            source = f"_from_{checkpoints_of}" if checkpoints_of not in (None, lib) else ""
            out = self.root / f"matrix_{lib}_{nproc}p_{phase}{source}"
            args, parent = [], None
            if phase == "resume":
                parent = self.matrix(checkpoints_of, nproc)
                args = ["--phase", "resume", "--checkpoints", str(parent.out / "ckpt")]
            self.done[key] = run_script(lib, SCRIPTS / "matrix.py", nproc, out, args, name=f"matrix {phase}",
                                        timeout=180 if phase == "train" else 90, parent=parent)
        return self.done[key]

    def script(self, name: str, lib: str, nproc: int, *args: str, timeout: float = 0, resume_from: str = "",
               checkpoints_of: str | None = None, switch: bool = False) -> Run:
        """A client-style script of ``scripts/`` run once with ``args``.

        ``resume_from="checkpoint-N"`` runs it again with
        ``--resume_from_checkpoint checkpoint-N`` over the checkpoints that
        the first run (same ``args``) of ``checkpoints_of`` (default: the
        same library) wrote.
        """
        checkpoints_of = (checkpoints_of or lib) if resume_from else None
        key = (name, lib, nproc, args, resume_from, checkpoints_of)
        timeout = timeout or CLIENT_TIMEOUTS.get(name, 180)
        if key not in self.done:
            source = f"_from_{checkpoints_of}" if checkpoints_of not in (None, lib) else ""
            suffix = f"_resume_{resume_from}{source}" if resume_from else ""
            # runs of one script with other arguments get folders of their own
            tag = "" if args in ((), ("--cpu",)) else "_" + hashlib.sha1(" ".join(args).encode()).hexdigest()[:8]
            out = self.root / f"{name}_{lib}_{nproc}p{tag}{suffix}"
            parent = None
            run_args = list(args)
            if resume_from:
                parent = self.script(name, checkpoints_of, nproc, *args, timeout=timeout, switch=switch)
                run_args += ["--resume_from_checkpoint", resume_from, "--checkpoints", str(parent.out)]
            self.done[key] = run_script(lib, SCRIPTS / f"{name}.py", nproc, out, run_args, name=name + suffix,
                                        timeout=timeout, parent=parent, switch=switch)
        return self.done[key]


def _key(record: dict[str, Any]) -> tuple:
    return record["r"], record.get("ph"), record.get("ep"), record.get("st")


def _show(value: Any) -> str:
    if isinstance(value, str) and value.startswith(("0x", "-0x")):
        return f"{value} ({float.fromhex(value):.9g})"
    if isinstance(value, list) and value and isinstance(value[0], str) and value[0].startswith(("0x", "-0x")):
        return "[" + ", ".join(f"{float.fromhex(v):.6g}" for v in value) + "]"
    return json.dumps(value)


def differences(peer: list[dict[str, Any]], ours: list[dict[str, Any]],
                fields: tuple[str, ...]) -> Iterator[tuple[int, dict[str, Any], list[tuple[str, Any, Any]]]]:
    """(position, peer record, [(field, peer value, hasten value)]) for each peer record hasten lacks or differs in."""
    theirs = {_key(r): r for r in ours}
    for position, record in enumerate(peer):
        other = theirs.get(_key(record))
        if other is None:
            yield position, record, [("(record)", "present", "missing")]
            continue
        bad = [(f, record.get(f), other.get(f)) for f in fields if record.get(f) != other.get(f)]
        if bad:
            yield position, record, bad


def first_difference(peer: list[dict[str, Any]], ours: list[dict[str, Any]], fields: tuple[str, ...]) -> str | None:
    """None when both lists hold the same records (matched by rank, phase, epoch, step) with equal ``fields``.

    Otherwise a readable account: the first record (in the peer's order)
    that is missing or differs, every field that differs there with both
    values, and how many later records differ too.
    """
    lines, found = [], list(differences(peer, ours, fields))
    if found:
        position, record, bad = found[0]
        where = ", ".join(f"{name} {value}" for name, value in zip(("rank", "phase", "epoch", "step"), _key(record))
                          if value is not None)
        lines.append(f"first difference at {where} (record {position + 1} of {len(peer)}):")
        lines += [f"  {f:8} accelerate {_show(a)}\n  {'':8} hasten     {_show(b)}" for f, a, b in bad]
        if len(found) > 1:
            lines.append(f"{len(found) - 1} later record(s) differ as well")
    mine = {_key(r) for r in peer}
    extra = [_key(r) for r in ours if _key(r) not in mine]
    if extra:
        lines.append(f"hasten has {len(extra)} record(s) accelerate does not, first: rank/phase/epoch/step {extra[0]}")
    return "\n".join(lines) or None


def as_uninterrupted(resumed: list[dict[str, Any]], saved: dict[str, Any]) -> list[dict[str, Any]]:
    """Resumed records under the uninterrupted run's keys (the resumed epoch's steps count after the skipped ones).

    ``saved`` is the record of the step after which the checkpoint was saved.

    Example:
        >>> as_uninterrupted([{"k": "step", "ph": "resume", "ep": 0, "st": 0}], {"ep": 0, "st": 2})[0]["st"]
        3
    """
    shifted = []
    for record in resumed:
        record = {**record, "ph": "train"}
        if record["k"] == "step" and record["ep"] == saved["ep"]:
            record["st"] += saved["st"] + 1
        shifted.append(record)
    return shifted


def max_abs_diff(peer: list[dict[str, Any]], ours: list[dict[str, Any]], field_name: str = "loss") -> float | None:
    """The largest |difference| of a hex-float field over the records both runs have (None: nothing in common)."""
    theirs = {_key(r): r for r in ours}
    diffs = [abs(float.fromhex(r[field_name]) - float.fromhex(theirs[_key(r)][field_name]))
             for r in peer if _key(r) in theirs and r.get(field_name) and theirs[_key(r)].get(field_name)]
    return max(diffs) if diffs else None
