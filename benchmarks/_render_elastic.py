"""RESULTS.md's section on elastic runs (`benchmarks/elastic.py`): kept apart so `_render.py` stays readable."""

from __future__ import annotations

from _tables import f, table


def elastic_section(records: list[dict]) -> list[str]:
    """## Elastic runs: the seconds a lost or returning machine costs, and what periodic checkpoints cost."""
    if not records:
        return []
    lines = ["## Elastic runs", "",
             ("Two \"machines\" on this host (two `hasten launch --num_machines 1:2` commands, one process each, a "
              "c10d endpoint on 127.0.0.1) train `tests/scripts/elastic_train.py` (`benchmarks/elastic.py`). *Shrink*: "
              "from the SIGKILL of machine 1's launcher and worker to the first optimizer step on machine 0 alone "
              "(gloo fails the pending collective at once; the lost machine's rendezvous heartbeats expire in 15 s; "
              "the survivor waits 10 s for latecomers; the script starts and loads the newest checkpoint). *Grow*: "
              "from starting machine 1's command again to the first step on two machines (the group saves on its way "
              "out, so nothing is redone). The peers have no elastic mode: a run of Accelerate or Fabric that loses a "
              "machine ends, and a person starts it again by hand on the machines left (Accelerate refuses another "
              "number of processes at resume)."), ""]
    rows = [[r["engine"], r["rounds"], f(r.get("shrink_s"), 1, " s"), f(r.get("grow_s"), 1, " s"),
             ", ".join(map(str, r.get("shrink_all", []))), ", ".join(map(str, r.get("grow_all", []))),
             "yes" if r.get("finished") else f"**no** {r.get('errors')}"]
            for r in records if r["name"].startswith("recovery")]
    lines += table(["engine", "rounds", "shrink (median)", "grow (median)", "shrink, each", "grow, each",
                    "every run finished"], rows)
    cost = next((r for r in records if r["name"] == "periodic checkpoint cost"), None)
    if cost and "ratio" in cost:
        lines += ["", (f"Periodic checkpoints (`ProjectConfiguration(save_every_n_steps=20)`, asynchronous) in a "
                       f"2-process DDP run of a 6M-parameter MLP, one thread per process ({f(cost['step_s'] * 1000, 0)} "
                       f"ms a step): rounds of 60 steps with and without them alternate; the median ratio of their "
                       f"times is **{f(cost['ratio'], 3)}** (each: {', '.join(f(x, 3) for x in cost['ratios'])})."), ""]
    return lines
