"""hasten's self-test, run on every process by `hasten test` (and by the test-suite).

Each check is real: collectives, data sharding, gradient synchronisation,
and a few training steps compared with the same steps done on one process.
It ends with one line on the main process: passed, or which check failed
on which rank. Exit status 0 / 1 accordingly.
"""

from __future__ import annotations

import sys
import traceback
from datetime import timedelta
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader

from hasten import Accelerator, InitProcessGroupKwargs, set_seed

CHECKS: list[tuple[str, Callable[[Accelerator], None]]] = []


def check(name: str) -> Callable[[Callable[[Accelerator], None]], Callable[[Accelerator], None]]:
    def register(function: Callable[[Accelerator], None]) -> Callable[[Accelerator], None]:
        CHECKS.append((name, function))
        return function

    return register


@check("topology")
def _topology(acc: Accelerator) -> None:
    seen = acc.gather_object([(acc.process_index, acc.num_processes)])
    assert sorted(rank for rank, _ in seen) == list(range(acc.num_processes)), f"ranks seen: {seen}"
    assert {world for _, world in seen} == {acc.num_processes}, f"world sizes disagree: {seen}"


@check("reduce")
def _reduce(acc: Accelerator) -> None:
    total = acc.reduce(torch.tensor([acc.process_index + 1.0], device=acc.device)).item()
    expected = acc.num_processes * (acc.num_processes + 1) / 2
    assert total == expected, f"sum of ranks+1 is {total}, expected {expected}"


@check("gather")
def _gather(acc: Accelerator) -> None:
    mine = torch.arange(2, device=acc.device) + 2 * acc.process_index
    gathered = acc.gather(mine).cpu().tolist()
    assert gathered == list(range(2 * acc.num_processes)), f"gathered {gathered}"


@check("broadcast")
def _broadcast(acc: Accelerator) -> None:
    value = torch.tensor([42.0 if acc.is_main_process else -1.0], device=acc.device)
    assert acc.broadcast(value).item() == 42.0, "rank 0's value did not arrive"


@check("data sharding")
def _sharding(acc: Accelerator) -> None:
    size = 10 * acc.num_processes + 3
    numbers: Any = list(range(size))  # a list is a map-style dataset
    loader: Any = DataLoader(numbers, batch_size=2, shuffle=True)
    saved = acc.even_batches
    acc.even_batches = False
    try:
        loader = acc.prepare_data_loader(loader)
    finally:
        acc.even_batches = saved
    mine = [i for batch in loader for i in batch.tolist()]
    everything = acc.gather_object(mine)
    assert sorted(everything) == list(range(size)), "shards overlap or miss samples"


def _model() -> torch.nn.Module:
    set_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def _data(count: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(count, 4, generator=generator)
    return x, x.sum(dim=1, keepdim=True)


@check("gradient sync")
def _gradient_sync(acc: Accelerator) -> None:
    model = acc.prepare_model(_model())
    x, y = _data(4 * acc.num_processes)
    share = slice(4 * acc.process_index, 4 * acc.process_index + 4)
    loss = torch.nn.functional.mse_loss(model(x[share].to(acc.device)), y[share].to(acc.device))
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])  # type: ignore[union-attr]  # after backward
    everyone = acc.gather(grads[None])
    assert torch.allclose(everyone, everyone[:1].expand_as(everyone)), "gradients differ across processes"


@check("equivalence with one process")
def _equivalence(acc: Accelerator) -> None:
    per_process, steps = 4, 3
    x, y = _data(per_process * acc.num_processes * steps)
    dataset: Any = list(zip(x, y))  # a list is a map-style dataset
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = acc.prepare(model, optimizer, DataLoader(dataset, batch_size=per_process))
    for xb, yb in loader:
        optimizer.zero_grad()
        acc.backward(torch.nn.functional.mse_loss(model(xb), yb))
        optimizer.step()
    reference = _model()
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for xb, yb in DataLoader(dataset, batch_size=per_process * acc.num_processes):
        ref_optimizer.zero_grad()
        torch.nn.functional.mse_loss(reference(xb), yb).backward()
        ref_optimizer.step()
    mine = acc.unwrap_model(model)
    diff = max((a.detach().cpu() - b.detach()).abs().max().item() for a, b in zip(mine.parameters(), reference.parameters()))
    assert diff <= 1e-5, f"parameters differ from the one-process run by {diff:.2e}"


def main() -> int:
    acc = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=120))])
    failures = []
    for name, function in CHECKS:
        try:
            function(acc)
        except Exception as error:  # noqa: BLE001 - a failed check is reported, not raised
            failures.append((acc.process_index, name, f"{type(error).__name__}: {error}"))
            if "--verbose" in sys.argv:
                traceback.print_exc()
    everyone = acc.gather_object(failures)
    if acc.is_main_process:
        where = f"{acc.num_processes} process(es), {acc.distributed_type.value}, device {acc.device.type}"
        if everyone:
            rank, name, message = everyone[0]
            print(f"hasten test: FAILED — check '{name}' on rank {rank}: {message} ({len(everyone)} failure(s); {where})")
        else:
            print(f"hasten test: passed — {len(CHECKS)} checks on {where}")
    acc.end_training()
    return 1 if everyone else 0


if __name__ == "__main__":
    raise SystemExit(main())
