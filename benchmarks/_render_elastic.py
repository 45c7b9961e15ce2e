"""RESULTS.md's sections on elastic runs (`benchmarks/elastic.py`) and on recovery beside torchft
(`benchmarks/recovery.py`): kept apart so `_render.py` stays readable."""

from __future__ import annotations

import math

from _tables import f, table


def elastic_section(records: list[dict]) -> list[str]:
    """## Elastic runs: the seconds a lost or returning machine costs, and what periodic checkpoints cost."""
    if not records:
        return []
    lines = ["## Elastic runs", "",
             ("Two \"machines\" on this host (two `hasten launch --num_machines 1:2` commands, one process each, a "
              "c10d endpoint on 127.0.0.1, the default rendezvous settings) train `tests/scripts/elastic_train.py` "
              "with the script's gradient accumulation 1 and 3 (`benchmarks/elastic.py`). *Shrink*: from the SIGKILL "
              "of machine 1's launcher and worker to the first optimizer step on machine 0 alone (gloo fails the "
              "pending collective at once; the lost machine's rendezvous heartbeats expire in 15 s; the survivor waits "
              "10 s for latecomers; the script starts and loads the newest checkpoint). *Grow*: from starting machine "
              "1's command again to the first step on two machines (the group saves right after an optimizer step on "
              "its way out, so nothing is redone). *Final parameters*: each run's, against the uninterrupted run's "
              "(the same script on 2 processes of one launch), the largest difference relative to a tensor's largest "
              "value, over the rounds. The peers have no elastic mode: a run of Accelerate or Fabric that loses a "
              "machine ends, and a person starts it again by hand on the machines left (Accelerate refuses another "
              "number of processes at resume)."), ""]
    rows = [[r["engine"], r.get("accumulation", 1), r["rounds"], f(r.get("shrink_s"), 1, " s"),
             f(r.get("grow_s"), 1, " s"), ", ".join(map(str, r.get("shrink_all", []))),
             ", ".join(map(str, r.get("grow_all", []))),
             "-" if r.get("final_difference") is None else f"{r['final_difference']:.1e}",
             "yes" if r.get("finished") else f"**no** {r.get('errors')}"]
            for r in records if r["name"].startswith("recovery")]
    lines += table(["engine", "accumulation", "rounds", "shrink (median)", "grow (median)", "shrink, each",
                    "grow, each", "final parameters vs uninterrupted", "every run finished"], rows)
    speed = next((r for r in records if r["name"] == "weighting cost"), None)
    if speed and "uneven_vs_even" in speed:
        lines += ["", ("The cost of the weighting: two processes train a 6M-parameter MLP (one thread each) with the "
                       "same work per process, 2 micro-batches a step, in rounds that alternate three layouts: 2 "
                       "processes of a `2:3` range (3 micro-batches a step: one takes 2, the other 1, each weighted "
                       "P / M), 2 of a `2:4` range (2 each) and a plain 2-process launch with accumulation 2. Steps/s "
                       f"against the `2:4` range, median over rounds: uneven **{f(speed['uneven_vs_even'], 3)}** "
                       f"(each: {', '.join(f(x, 3) for x in speed['uneven_all'])}), plain "
                       f"{f(speed['plain_vs_even'], 3)} (each: {', '.join(f(x, 3) for x in speed['plain_all'])}); "
                       f"a step of the `2:4` range took {f(speed['step_s']['even'] * 1000, 0)} ms. At the uneven size "
                       "a step holds 3 micro-batches instead of 4, so its samples/s are "
                       f"{f(speed['uneven_samples_vs_even'], 3)} of the even size's: the process that takes one fewer "
                       "waits for the other.")]
    cost = next((r for r in records if r["name"] == "periodic checkpoint cost"), None)
    if cost and "ratio" in cost:
        cpu = ""
        if "accounted_core_free" in cost:
            cpu += (f"; accounted from the saves' own time (steady): each save holds the training threads "
                    f"{f(cost['save_training_ms'], 1)} ms (the next optimizer step's wait for the parameters' copy "
                    f"{f(cost['save_copy_wait_ms'], 2)} ms of it) and its background threads use "
                    f"{f(cost['save_background_cpu_ms'], 0)} ms of CPU: **{f(cost['accounted_core_free'], 3)}** with a "
                    f"core free for the writer, **{f(cost['accounted_cores_busy'], 3)}** with every core busy "
                    "training, as here")
        if "training_cpu_ratio" in cost:
            cpu += (f"; by CPU seconds over both processes, summed over the rounds (steadier on this shared VM, whose "
                   f"rounds vary by about 10 %): the training threads' **{f(cost['training_cpu_ratio'], 3)}** (what "
                   f"the save adds to the training path), every thread's **{f(cost['all_threads_cpu_ratio'], 3)}** "
                   "(the writer's work too, which takes CPU from training when, as here, training keeps both cores "
                   "busy)")
        lines += ["", (f"Periodic checkpoints (`ProjectConfiguration(save_every_n_steps=20)`, asynchronous) in a "
                       f"2-process DDP run of a 6M-parameter MLP (75 MB saved), one thread per process "
                       f"({f(cost['step_s'] * 1000, 0)} ms a step): rounds of 60 steps with and without them "
                       f"alternate, each round's saves in its middle; the median ratio of their times is "
                       f"**{f(cost['ratio'], 3)}** (each: {', '.join(f(x, 3) for x in cost['ratios'])}){cpu}."), ""]
        if "accounted_core_free" in cost:  # the accounted cost is per save: 1.01 where a save's share of steps is 1 %
            every = cost.get("every", 20)

            def reach(ratio: float) -> int:
                return max(1, math.ceil(every * (ratio - 1) / 0.01))

            lines += [(f"At that cost per save, the saves cost 1.01 from one every **{reach(cost['accounted_core_free'])} "
                       f"steps** with a core free for the writer, and from one every "
                       f"**{reach(cost['accounted_cores_busy'])} steps** with every core busy training (this machine, "
                       f"{f(cost['step_s'] * 1000, 0)} ms steps)."), ""]
        sparser = [r for r in records if r["name"].startswith("periodic checkpoint cost, every") and "ratio" in r]
        if sparser:
            lines += [("Sparser saves, the same way (rounds of three saves' worth of steps): " + "; ".join(
                f"every {r['every']} steps **{f(r['ratio'], 3)}**"
                + (f" (accounted: {f(r['accounted_core_free'], 3)} with a core free, {f(r['accounted_cores_busy'], 3)} "
                   "with every core busy)" if "accounted_core_free" in r else "")
                + (f" (CPU: training threads {f(r['training_cpu_ratio'], 3)}, every thread "
                   f"{f(r['all_threads_cpu_ratio'], 3)})" if "training_cpu_ratio" in r else "")
                for r in sparser) + "."), ""]
    return lines


def recovery_section(records: list[dict]) -> list[str]:
    """## Recovery beside torchft: the seconds, steps redone and samples lost when a machine is SIGKILLed."""
    if not records:
        return []
    lines = ["## Recovery beside torchft", "",
             ("Two \"machines\" of one process each on this host; machine 1 is SIGKILLed (every process of it) after "
              "its step 20, then its command starts again (`benchmarks/recovery.py`). torchft 0.2.0 runs its own DDP "
              "example (`_torchft_ddp.py`: its wiring, an MLP on indexed synthetic samples instead of CIFAR-10) with "
              "its README's lighthouse flags, killed between two steps and inside a step. hasten live "
              "(`--elastic_recovery live`) runs the same model, data and batch written the Accelerate way "
              "(`_hasten_live.py`), killed inside a step; hasten restart (the default) runs "
              "`benchmarks/elastic.py`'s DDP round (`--num_machines 1:2`). *Recovery*: kill to the survivor's next "
              "optimizer step. *Join*: the new command to its first step in the group of two. *Steps redone*: "
              "optimizer steps trained twice (hasten live: attempts dealt again, after the slash, are not stepped). "
              "*Dropped*: samples of the uninterrupted run never trained; *twice*: samples trained twice (hasten "
              "restart: its final parameters against the uninterrupted run's instead, every sample once)."), ""]
    rows = [[r["name"].split(", ", 1)[1], "**crashed** " + str(r.get("error") or "") if r.get("crashed") else
             f(r.get("recovery_s"), 2, " s"), f(r.get("join_s"), 2, " s"),
             "-" if r.get("steps_redone") is None else
             f"{r['steps_redone']}" + (f" / {r['attempts_dealt_again']}" if "attempts_dealt_again" in r else ""),
             r.get("samples_dropped", "-"), r.get("samples_twice", "-"),
             "-" if r.get("final_difference") is None else f"{r['final_difference']:.1e}"]
            for r in records]
    lines += table(["run", "recovery", "join", "steps redone", "samples dropped", "samples twice",
                    "final parameters vs uninterrupted"], rows)
    return lines + [""]
