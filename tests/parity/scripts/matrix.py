"""Many small training scenarios in one launch, written for Accelerate 1.16 (hasten runs it with its imports rewritten).

Each scenario re-creates the Accelerator (after resetting the shared state,
as Accelerate's own test scripts do), seeds, builds a tiny model with
dropout, a dataset whose items carry their own index, an optimizer and a
scheduler, prepares them and trains for two epochs with an eval pass after
each. Every rank appends one JSON line per step to
``OUT/records_rank<R>.jsonl``: the dataset indices of its batch, a digest of
the global torch RNG before the step, the loss and learning rate as
``float.hex``, ``sync_gradients``, ``end_of_dataloader``, the norm
``clip_grad_norm_`` returned, and per eval step the rows
``gather_for_metrics`` returned. ``tests/parity`` compares these records
between the two libraries.

Run it::

    python matrix.py --out OUT [--only plain,bf16]
    python matrix.py --out OUT2 --phase resume --checkpoints OUT/ckpt   # load_state + skip_first_batches

Example:
    >>> SCENARIOS["plain"]["epochs"]
    2
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import traceback

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import DataLoaderConfiguration, GradientAccumulationPlugin, set_seed

BASE = dict(epochs=2, n_train=26, batch_size=4, n_eval=21, eval_batch_size=4, lr=0.05, optimizer="adamw",
            sched="linear", mp="no", accum=1, sync_each_batch=False, split_batches=False, even_batches=True,
            dispatch_batches=None, seedable=False, generator=False, iterable=False, device_specific=False,
            gather_object=False, save_at=None)


def scenario(**changes):
    unknown = set(changes) - set(BASE)
    if unknown:
        raise KeyError(f"unknown scenario settings {sorted(unknown)}")
    return {**BASE, **changes}


SCENARIOS = {
    "plain": scenario(),
    "accum4": scenario(accum=4, n_train=40, batch_size=2),
    "accum4_sync_each_batch": scenario(accum=4, sync_each_batch=True, n_train=40, batch_size=2),
    "bf16": scenario(mp="bf16"),
    "fp16": scenario(mp="fp16"),
    "sched_onecycle": scenario(sched="onecycle", optimizer="sgd"),
    "sched_step": scenario(sched="step"),
    "sched_cosine": scenario(sched="cosine"),
    "split_batches": scenario(split_batches=True, batch_size=8),
    # 30 training rows in batches of 4: on 2 processes each rank gets 4 batches, rank 1's last holds 2 rows (not
    # padded); an uneven batch count would hang DDP under both libraries. The 21 eval rows split 12 / 9: tensors of
    # different sizes cannot be all-gathered (gloo aborts under Accelerate too), so the eval gathers objects.
    "even_batches_false": scenario(even_batches=False, n_train=30, gather_object=True),
    "iterable": scenario(iterable=True),  # dispatch_batches defaults to True for an iterable dataset
    "iterable_no_dispatch": scenario(iterable=True, dispatch_batches=False),
    "seedable_off_generator": scenario(generator=True),
    "seedable_on": scenario(seedable=True),
    "seedable_on_generator": scenario(seedable=True, generator=True),
    "dispatch_batches": scenario(dispatch_batches=True),
    "device_specific_seed": scenario(device_specific=True),
    "gather_object": scenario(gather_object=True),
    "resume": scenario(save_at=3),  # saved after 3 optimizer steps (mid epoch 0 on 1 and 2 processes)
}


class IndexedSet(Dataset):
    """Regression rows that also return their own index, so the records show which samples a batch held."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)  # never the global RNG: building data must not shift it
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x @ torch.tensor([1.5, -2.0, 0.5, 1.0]) + 0.1 * torch.randn(n, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i], "idx": torch.tensor(i)}


class IndexedStream(IterableDataset):
    def __init__(self, n, seed):
        self.rows = IndexedSet(n, seed)

    def __len__(self):  # known length, so the schedule can be sized from len(train_dl) as for a map-style set
        return len(self.rows)

    def __iter__(self):
        for i in range(len(self.rows)):
            yield self.rows[i]


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Dropout(0.25), torch.nn.Linear(16, 1))


def make_scheduler(kind, optimizer, total):
    if kind == "linear":  # warm-up then linear decay, as transformers' get_linear_schedule_with_warmup
        warmup = max(1, total // 5)
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: s / warmup if s < warmup else max(0.0, (total - s) / max(1, total - warmup)))
    if kind == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=total)
    if kind == "step":
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    if kind == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total)
    raise ValueError(kind)


def hexf(value):
    return None if value is None else float(value).hex()


def rng_digest():
    return hashlib.sha1(torch.get_rng_state().numpy().tobytes()).hexdigest()[:10]


class Recorder:
    def __init__(self, out):
        os.makedirs(out, exist_ok=True)
        self.file = open(os.path.join(out, f"records_rank{int(os.environ.get('RANK', 0))}.jsonl"), "a")

    def __call__(self, **record):
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()


def reset_shared_state(record, name):
    """Forget the previous scenario's Accelerator, the way Accelerate's test scripts do between checks."""
    try:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    except Exception as error:  # recorded, not fatal: the comparison reports it
        record(k="reset_error", s=name, error=f"{type(error).__name__}: {error}")


def run_scenario(name, cfg, record, phase, checkpoints, out):
    plugin = GradientAccumulationPlugin(num_steps=cfg["accum"], sync_each_batch=cfg["sync_each_batch"])
    dl_config = DataLoaderConfiguration(split_batches=cfg["split_batches"], even_batches=cfg["even_batches"],
                                        dispatch_batches=cfg["dispatch_batches"],
                                        use_seedable_sampler=cfg["seedable"])
    accelerator = Accelerator(cpu=True, mixed_precision=cfg["mp"], gradient_accumulation_plugin=plugin,
                              dataloader_config=dl_config)
    set_seed(42, device_specific=cfg["device_specific"])

    model = make_model()
    train_set = (IndexedStream if cfg["iterable"] else IndexedSet)(cfg["n_train"], seed=0)
    loader_kwargs = {} if cfg["iterable"] else {"shuffle": True}
    if cfg["generator"]:
        loader_kwargs["generator"] = torch.Generator().manual_seed(1234)
    train_dl = DataLoader(train_set, batch_size=cfg["batch_size"], **loader_kwargs)
    eval_dl = DataLoader(IndexedSet(cfg["n_eval"], seed=1), batch_size=cfg["eval_batch_size"])
    if cfg["optimizer"] == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
    model, optimizer, train_dl, eval_dl = accelerator.prepare(model, optimizer, train_dl, eval_dl)

    # Sized as Hugging Face's no_trainer examples size it under Accelerate: steps * num_processes.
    steps_per_epoch = math.ceil(len(train_dl) / cfg["accum"])
    max_train_steps = cfg["epochs"] * steps_per_epoch
    total = max_train_steps * accelerator.num_processes
    scheduler = accelerator.prepare(make_scheduler(cfg["sched"], optimizer, total))
    record(k="setup", s=name, ph=phase, distributed_type=getattr(accelerator.distributed_type, "value",
                                                                   str(accelerator.distributed_type)),
           num_processes=accelerator.num_processes, mixed_precision=accelerator.mixed_precision,
           train_batches=len(train_dl), eval_batches=len(eval_dl), rng=rng_digest())

    starting_epoch, resume_step, overall_step = 0, None, 0
    if phase == "resume":  # as Accelerate's examples/by_feature/checkpointing.py resumes from "step_<n>"
        accelerator.load_state(os.path.join(checkpoints, name))
        resume_step = cfg["save_at"] * cfg["accum"]
        starting_epoch = resume_step // len(train_dl)
        resume_step -= starting_epoch * len(train_dl)
        record(k="loaded", s=name, ph=phase, rng=rng_digest(), lr=hexf(scheduler.get_last_lr()[0]),
               params=param_sums(model, accelerator), moments=moment_sums(optimizer))

    for epoch in range(starting_epoch, cfg["epochs"]):
        model.train()
        active_dl = train_dl
        if phase == "resume" and epoch == starting_epoch and resume_step:
            active_dl = accelerator.skip_first_batches(train_dl, resume_step)
            overall_step += resume_step
        for step, batch in enumerate(active_dl):
            rng = rng_digest()
            norm = None
            with accelerator.accumulate(model):
                output = model(batch["x"])
                loss = torch.nn.functional.mse_loss(output.float().squeeze(-1), batch["y"])
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            record(k="step", s=name, ph=phase, ep=epoch, st=step, idx=batch["idx"].tolist(), rng=rng,
                   loss=hexf(loss.item()), lr=hexf(scheduler.get_last_lr()[0]), sync=accelerator.sync_gradients,
                   eod=accelerator.gradient_state.end_of_dataloader, norm=hexf(norm),
                   skipped=bool(optimizer.step_was_skipped))
            overall_step += 1
            if cfg["save_at"] and phase == "train" and overall_step == cfg["save_at"] * cfg["accum"]:
                accelerator.save_state(os.path.join(out, "ckpt", name))
                record(k="saved", s=name, ph=phase, ep=epoch, st=step, rng=rng_digest())

        model.eval()
        for step, batch in enumerate(eval_dl):
            with torch.no_grad():
                prediction = model(batch["x"]).float().squeeze(-1)
            if cfg["gather_object"]:
                pairs = [(int(i), float(p).hex()) for i, p in zip(batch["idx"].tolist(), prediction.tolist())]
                rows = accelerator.gather_for_metrics(pairs, use_gather_object=True)
                record(k="eval", s=name, ph=phase, ep=epoch, st=step, rows=[r[0] for r in rows],
                       preds=[r[1] for r in rows])
            else:
                rows, preds = accelerator.gather_for_metrics((batch["idx"], prediction))
                record(k="eval", s=name, ph=phase, ep=epoch, st=step, rows=rows.tolist(),
                       preds=[hexf(p) for p in preds.tolist()])

    record(k="final", s=name, ph=phase, params=param_sums(model, accelerator), rng=rng_digest())


def param_sums(model, accelerator):
    return {n: hexf(p.detach().double().sum()) for n, p in accelerator.unwrap_model(model).named_parameters()}


def moment_sums(optimizer):
    """The optimizer's per-parameter state, summed (what load_state restored)."""
    return [{k: hexf(v.double().sum()) if torch.is_tensor(v) else v for k, v in sorted(state.items())}
            for state in optimizer.state_dict()["state"].values()]


def processes_still_together():
    """After a failed scenario: can every process still meet (a refused option) or is the group broken (a crash)?"""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return True
    try:
        torch.distributed.monitored_barrier(timeout=datetime.timedelta(seconds=20))
        return True
    except Exception:
        return False


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default="", help="comma-separated scenario names (default: all)")
    parser.add_argument("--phase", choices=["train", "resume"], default="train")
    parser.add_argument("--checkpoints", default=None, help="with --phase resume: the train run's OUT/ckpt")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(SCENARIOS)
    if args.phase == "resume":
        names = [n for n in names if SCENARIOS[n]["save_at"]]
    record = Recorder(args.out)
    for name in names:
        reset_shared_state(record, name)
        try:
            run_scenario(name, SCENARIOS[name], record, args.phase, args.checkpoints, args.out)
        except Exception as error:  # the next scenarios still run; the comparison reports this one
            record(k="error", s=name, ph=args.phase, error=f"{type(error).__name__}: {error}",
                   where=traceback.format_exc().strip().splitlines()[-3:])
            if not processes_still_together():
                record(k="abort", s=name, ph=args.phase)
                break
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()  # a clean gloo shutdown (no teardown abort), then the end marker
    record(k="done")


if __name__ == "__main__":
    main()
