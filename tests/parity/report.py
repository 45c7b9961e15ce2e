"""Run every parity script under Accelerate 1.16 and under hasten, 1 and 2 processes, and print the parity table.

One row per case (a matrix scenario or a client script) and process count:
steps compared, the first differing step and fields, max |loss diff|,
whether the learning rates and the batches' dataset indices are equal, the
rows ``gather_for_metrics`` returned (Accelerate / hasten) and the final
metric of the client scripts. Multi-process runs take ``/tmp/hasten-mp.lock``.

Run it::

    python3 tests/parity/report.py                 # everything (a few minutes)
    python3 tests/parity/report.py --procs 1 --only matrix
    python3 tests/parity/report.py --markdown      # a table to paste into a note

Example:
    >>> _brief([("loss", 1, 2), ("idx", [1], [2])])
    'loss,idx'
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: conftest and the parity package

from parity.harness import (HASTEN, PEER, STEP_FIELDS, Run, Runs, as_uninterrupted, differences,  # noqa: E402
                            max_abs_diff, scenario_names)

CLIENTS = ("glue_client", "diffusers_client")


def _brief(bad: list[tuple[str, Any, Any]]) -> str:
    return ",".join(name for name, _, _ in bad)


def _equal(peer: list[dict], ours: list[dict], name: str) -> str:
    found = list(differences(peer, ours, (name,)))
    return "yes" if not found else f"no ({len(found)})"


def _eval_rows(run: Run, scenario: str | None, phase: str) -> int:
    """Rows rank 0 got back from gather_for_metrics over the run's last eval pass."""
    evals = [r for r in run.of("eval", scenario, phase) if r["r"] == 0]
    if not evals:
        return 0
    last = max(r["ep"] for r in evals)
    return sum(len(r["rows"]) for r in evals if r["ep"] == last)


def row(case: str, nproc: int, peer: Run, ours: Run, scenario: str | None = None, phase: str | None = "train") -> dict:
    """One line of the table, comparing ``ours`` with ``peer`` for one scenario (or a whole client run)."""
    out: dict[str, Any] = {"case": case, "procs": nproc}
    for label, run in (("accelerate", peer), ("hasten", ours)):
        errors = [r["error"] for r in run.of("error", scenario, phase)]
        if run.failure or errors:
            out["note"] = f"{label}: " + (errors[0] if errors else run.failure.splitlines()[0])[:150]
            return out
    steps, mine = peer.of("step", scenario, phase), ours.of("step", scenario, phase)
    keys = {(r["r"], r["ep"], r["st"]) for r in mine}
    first = next(differences(steps, mine, STEP_FIELDS), None)
    loss = max_abs_diff(steps, mine)
    metric_p, metric_h = peer.of("metric", scenario, phase), ours.of("metric", scenario, phase)
    out.update(
        steps=f"{sum((r['r'], r['ep'], r['st']) in keys for r in steps)}/{len(steps)}",
        first_diff="-" if first is None else
        f"ep{first[1]['ep']} st{first[1]['st']} r{first[1]['r']}: {_brief(first[2])}",
        max_loss_diff="-" if loss is None else f"{loss:.3g}",
        lr_equal=_equal(steps, mine, "lr"), idx_equal=_equal(steps, mine, "idx"),
        eval_rows=f"{_eval_rows(peer, scenario, phase)}/{_eval_rows(ours, scenario, phase)}"
        + ("" if next(differences(peer.of("eval", scenario, phase), ours.of("eval", scenario, phase),
                                  ("rows",)), None) is None else " differ"),
        metric="-" if not metric_p else
        f"{metric_p[-1]['value']:.4f}/{metric_h[-1]['value']:.4f}" if metric_h else f"{metric_p[-1]['value']:.4f}/-",
    )
    return out


def exactness(uninterrupted: Run, resumed: Run) -> tuple[Run, Run]:
    """(uninterrupted run, resumed run renamed to its keys): the matrix's resume compared with never stopping."""
    saved = uninterrupted.of("saved", "resume")[0] if uninterrupted.of("saved", "resume") else {"ep": 0, "st": -1}
    after = [r for r in uninterrupted.records if not (r.get("s") == "resume" and r["k"] == "step"
                                                       and (r["ep"], r["st"]) <= (saved["ep"], saved["st"]))]
    return (replace(uninterrupted, records=after),
            replace(resumed, records=as_uninterrupted([r for r in resumed.records if r.get("s") == "resume"], saved)))


COLUMNS = ("case", "procs", "steps", "first_diff", "max_loss_diff", "lr_equal", "idx_equal", "eval_rows", "metric",
           "note")


def print_table(rows: list[dict], markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(COLUMNS) + " |")
        print("|" + "---|" * len(COLUMNS))
        for r in rows:
            print("| " + " | ".join(str(r.get(c, "")) for c in COLUMNS) + " |")
        return
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in COLUMNS}
    print("  ".join(c.ljust(widths[c]) for c in COLUMNS))
    for r in rows:
        print("  ".join(str(r.get(c, "")).ljust(widths[c]) for c in COLUMNS))


class _Lock:
    """flock /tmp/hasten-mp.lock around multi-process runs, as every such run on this machine takes it."""

    def __enter__(self):
        self.file = open("/tmp/hasten-mp.lock", "w")
        fcntl.flock(self.file, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", default="1,2", help="process counts (default: 1,2)")
    parser.add_argument("--only", default="matrix," + ",".join(CLIENTS), help="matrix and/or client script names")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--keep", default=None, help="write the runs here (default: a temporary folder)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    root = Path(args.keep or tempfile.mkdtemp(prefix="hasten-parity-"))
    root.mkdir(parents=True, exist_ok=True)
    runs, rows = Runs(root), []
    wanted = args.only.split(",")
    for nproc in (int(p) for p in args.procs.split(",")):
        with _Lock() if nproc > 1 else contextlib.nullcontext():
            if "matrix" in wanted:
                peer, ours = runs.matrix(PEER, nproc), runs.matrix(HASTEN, nproc)
                rows += [row(s, nproc, peer, ours, s) for s in scenario_names()]
                resumed = runs.matrix(HASTEN, nproc, "resume")
                rows.append(row("resume: own ckpt vs never stopped", nproc, *exactness(peer, resumed),
                                "resume", "train"))
                rows.append(row("resume: accelerate's ckpt", nproc, runs.matrix(PEER, nproc, "resume"),
                                runs.matrix(HASTEN, nproc, "resume", PEER), "resume", "resume"))
            for client in CLIENTS:
                if client not in wanted:
                    continue
                peer, ours = runs.script(client, PEER, nproc, "--cpu"), runs.script(client, HASTEN, nproc, "--cpu")
                rows.append(row(client, nproc, peer, ours, phase=None))
                if client == "diffusers_client":  # resumed from checkpoint-4: steps keep their numbers
                    resumed = runs.script(client, HASTEN, nproc, "--cpu", resume_from="checkpoint-4")
                    first = min(((r["ep"], r["st"]) for r in resumed.of("step")), default=(0, 0))
                    later = replace(peer, records=[r for r in peer.records if r["k"] != "step"
                                                   or (r["ep"], r["st"]) >= first])
                    resumed_row = row(f"{client}: own ckpt vs never stopped", nproc, later, resumed, phase=None)
                    if nproc > 1 and "note" not in resumed_row:  # see test_diffusers_client_resumes_exactly
                        resumed_row["note"] = ("main process saved alone (the diffusers pattern): no rank-1 RNG "
                                               "in the checkpoint under either library; batches and rank 0 compared")
                    rows.append(resumed_row)
                    rows.append(row(f"{client}: accelerate's ckpt", nproc,
                                    runs.script(client, PEER, nproc, "--cpu", resume_from="checkpoint-4"),
                                    runs.script(client, HASTEN, nproc, "--cpu", resume_from="checkpoint-4",
                                                checkpoints_of=PEER), phase=None))
    print_table(rows, args.markdown)
    print(f"\n{len(rows)} rows in {time.perf_counter() - started:.0f}s; runs in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
