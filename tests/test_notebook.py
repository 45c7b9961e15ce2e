"""notebook_launcher / debug_launcher: from pytest (forked workers) and from a real Jupyter kernel.

The launched functions are defined in this module (workers are forked, so
they need not be importable) and write one JSON file per rank; the tests
compare those values with a single-process reference.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from hasten import debug_launcher, notebook_launcher
from hasten.launch.notebook import WorkerFailedError
from hasten.launch.plan import LaunchError, available_cpus, find_free_port

STEPS = 3
LR = 0.1


# -- functions that run in the workers -------------------------------------------------------------
def _rank_data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Different data on every rank, so that the ranks only agree if gradients are all-reduced."""
    generator = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(8, 4, generator=generator)
    return x, x.sum(dim=1, keepdim=True) * (rank + 1)


def _initial_model() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1)


def train_fn(out_dir: str) -> None:
    """A few DDP steps; each rank writes its rank, environment and final parameters."""
    from hasten import Accelerator, LaunchSpec

    accelerator = Accelerator()
    assert accelerator.num_processes == 2, accelerator.num_processes
    model = _initial_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    model, optimizer = accelerator.prepare(model, optimizer)
    x, y = _rank_data(accelerator.process_index)
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
    params = [p.detach().flatten().tolist() for p in accelerator.unwrap_model(model).parameters()]
    result = {
        "rank": accelerator.process_index,
        "world_size": accelerator.num_processes,
        "distributed_type": str(accelerator.distributed_type),
        "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")},
        "torch_threads": torch.get_num_threads(),
        "spec_cpu": LaunchSpec.from_env().cpu,
        "mixed_precision": accelerator.mixed_precision,
        "pid": os.getpid(),
        "params": params,
    }
    Path(out_dir, f"rank{accelerator.process_index}.json").write_text(json.dumps(result))


def precision_fn(out_dir: str) -> None:
    from hasten import Accelerator

    accelerator = Accelerator()
    Path(out_dir, f"rank{accelerator.process_index}.json").write_text(
        json.dumps({"mixed_precision": accelerator.mixed_precision, "pid": os.getpid(),
                    "env": os.environ.get("ACCELERATE_MIXED_PRECISION")})
    )


def fail_fn(out_dir: str, healthy_rank_is: str) -> None:
    """Rank 1 raises ValueError("boom"); rank 0 waits at a barrier or sleeps (only the launcher can stop it)."""
    from hasten import Accelerator

    accelerator = Accelerator()
    rank = accelerator.process_index
    accelerator.wait_for_everyone()  # both ranks are connected
    Path(out_dir, f"pid{rank}").write_text(str(os.getpid()))
    if rank == 1:
        time.sleep(0.3)  # let rank 0 reach its waiting point first
        raise ValueError("boom")
    if healthy_rank_is == "busy":
        time.sleep(90)
    else:
        accelerator.wait_for_everyone()
    Path(out_dir, f"rank{rank}_done").write_text("yes")


def record_call(out_dir: str) -> None:
    Path(out_dir, "called").write_text(json.dumps({"pid": os.getpid(), "spec": os.environ.get("HASTEN_LAUNCH_SPEC")}))


# -- helpers -----------------------------------------------------------------------------------------
def _results(out_dir: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in sorted(out_dir.glob("rank*.json"))}


def _reference_params() -> list[list[float]]:
    """One process, both ranks' data in one batch: what DDP over 2 equal shards must give."""
    model = _initial_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    xs, ys = zip(*(_rank_data(rank) for rank in range(2)))
    x, y = torch.cat(xs), torch.cat(ys)
    for _ in range(STEPS):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return [p.detach().flatten().tolist() for p in model.parameters()]


def _child_pids() -> list[int]:
    """Live (non-zombie) processes whose parent is this one."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == os.getpid() and state != "Z":
            children.append(int(entry.name))
    return children


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _assert_trained_together(results: dict[int, dict], port: int | None) -> None:
    assert sorted(results) == [0, 1], f"ranks that wrote results: {sorted(results)}"
    reference = _reference_params()
    for rank, result in results.items():
        env = result["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == (str(rank), str(rank), "2", "2")
        assert env["MASTER_ADDR"] == "127.0.0.1"
        if port is not None:
            assert env["MASTER_PORT"] == str(port)
        assert result["world_size"] == 2
        assert "MULTI_CPU" in result["distributed_type"], result["distributed_type"]
        expected_threads = int(os.environ.get("OMP_NUM_THREADS") or max(1, available_cpus() // 2))
        assert env["OMP_NUM_THREADS"] == str(expected_threads)
        assert result["torch_threads"] == expected_threads
        # gradients were averaged over both ranks' data: equal to the one-process reference, not to a rank alone
        for got, want in zip(result["params"], reference):
            assert got == pytest.approx(want, abs=1e-5), f"rank {rank}: {result['params']} != {reference}"
    assert results[0]["params"] == results[1]["params"]
    assert results[0]["pid"] != results[1]["pid"] != os.getpid()


# -- from pytest ---------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_notebook_launcher_trains_with_ddp_on_two_processes(tmp_path):
    port = find_free_port()
    environ_before = dict(os.environ)
    sigterm_before = signal.getsignal(signal.SIGTERM)

    assert notebook_launcher(train_fn, (str(tmp_path),), num_processes=2, use_port=str(port)) is None
    # the caller's process is left as it was: no leftover variables or signal handlers
    # (checked first: the reference computation below makes torch set TORCHINDUCTOR_CACHE_DIR)
    assert dict(os.environ) == environ_before
    assert signal.getsignal(signal.SIGTERM) == sigterm_before

    results = _results(tmp_path)
    _assert_trained_together(results, port)
    assert not any(r["spec_cpu"] for r in results.values())  # notebook_launcher does not force the CPU
    assert all(r["mixed_precision"] == "no" for r in results.values())
    # no worker is left behind
    assert _child_pids() == []
    assert not any(_alive(r["pid"]) for r in results.values())


@pytest.mark.timeout(120)
def test_debug_launcher_trains_on_cpu_processes(tmp_path):
    assert debug_launcher(train_fn, (str(tmp_path),), num_processes=2) is None
    results = _results(tmp_path)
    _assert_trained_together(results, port=None)
    assert all(r["spec_cpu"] for r in results.values())
    assert _child_pids() == []


@pytest.mark.timeout(120)
def test_mixed_precision_reaches_the_accelerators(tmp_path):
    notebook_launcher(precision_fn, (str(tmp_path),), num_processes=2, mixed_precision="bf16", use_port=find_free_port())
    results = _results(tmp_path)
    assert {rank: r["mixed_precision"] for rank, r in results.items()} == {0: "bf16", 1: "bf16"}
    assert {r["env"] for r in results.values()} == {"bf16"}  # as Accelerate's notebook_launcher exports it


@pytest.mark.timeout(120)
@pytest.mark.parametrize("launcher", ["notebook", "debug"])
@pytest.mark.parametrize("healthy_rank_is", ["barrier", "busy"])
def test_worker_exception_reaches_the_caller(tmp_path, launcher, healthy_rank_is):
    start = time.monotonic()
    with pytest.raises(WorkerFailedError) as caught:
        if launcher == "notebook":
            notebook_launcher(fail_fn, (str(tmp_path), healthy_rank_is), num_processes=2, use_port=find_free_port())
        else:
            debug_launcher(fail_fn, (str(tmp_path), healthy_rank_is), num_processes=2)
    elapsed = time.monotonic() - start
    error = caught.value
    message = str(error)
    # scripts written for torchrun or the peer catch torch's error type (and RuntimeError)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    assert isinstance(error, ChildFailedError) and isinstance(error, RuntimeError) and error.failures

    # the root cause (rank 1's ValueError), not rank 0's lost-peer error or its stop
    assert error.rank == 1, message
    assert message.startswith("rank 1 of 2 failed with ValueError: boom"), message
    assert "rank 0" not in message, message
    assert error.error == "ValueError: boom"
    # the worker's own traceback text, with the user's frame
    assert "Traceback (most recent call last)" in message, message
    assert 'raise ValueError("boom")' in message and "in fail_fn" in message, message
    assert "Connection closed by peer" not in message
    # rank 0 was stopped promptly (not after its 90 s sleep or the group's timeout) and nothing is left behind
    assert elapsed < 45, f"the failed launch took {elapsed:.0f}s"
    assert not list(tmp_path.glob("rank*_done"))
    worker_pids = [int(p.read_text()) for p in tmp_path.glob("pid*")]
    assert len(worker_pids) == 2
    assert not any(_alive(pid) for pid in worker_pids)
    assert _child_pids() == []


def killed_fn(out_dir: str, healthy_rank_is: str) -> None:
    """Rank 1 dies from SIGKILL (as from the OOM killer); rank 0 waits at a barrier or sleeps."""
    from hasten import Accelerator

    accelerator = Accelerator()
    accelerator.wait_for_everyone()
    Path(out_dir, f"pid{accelerator.process_index}").write_text(str(os.getpid()))
    if accelerator.process_index == 1:
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    if healthy_rank_is == "busy":
        time.sleep(90)
    else:
        accelerator.wait_for_everyone()
    Path(out_dir, f"rank{accelerator.process_index}_done").write_text("yes")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("healthy_rank_is", ["barrier", "busy"])
def test_worker_killed_by_a_signal_is_reported(tmp_path, healthy_rank_is):
    with pytest.raises(WorkerFailedError) as caught:
        debug_launcher(killed_fn, (str(tmp_path), healthy_rank_is), num_processes=2)
    message = str(caught.value)
    killed = "rank 1 of 2 was killed by SIGKILL"
    if healthy_rank_is == "busy":  # rank 0 has no error of its own: the agent sees rank 1's death
        assert message == killed
        assert caught.value.rank == 1
    else:  # the agent may see rank 1's death first, or only rank 0's lost peer (rank 1 left no error file)
        assert message.startswith((killed, "rank 0 of 2 lost contact with another process of the run")), message
        assert " failed with " not in message.splitlines()[0], message
    assert not list(tmp_path.glob("rank*_done"))
    assert not any(_alive(int(p.read_text())) for p in tmp_path.glob("pid*"))
    assert _child_pids() == []


def collect_garbage_fn(out_dir: str) -> None:
    import gc

    from hasten import Accelerator

    accelerator = Accelerator()
    gc.collect()  # must not finalize the launching process's garbage (its TCPStore joins a thread we lack)
    Path(out_dir, f"rank{accelerator.process_index}_done").write_text("yes")


@pytest.mark.timeout(60)  # without the fix the workers crash or hang
def test_workers_do_not_collect_the_launching_process_garbage(tmp_path):
    """A forked worker that garbage-collected a TCPStore server of the parent would die from SIGSEGV."""
    import gc

    from torch.distributed import TCPStore

    gc.disable()  # keep the cycle uncollected in this process until the workers are forked
    try:
        cycle: list = [TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)]
        cycle.append(cycle)
        del cycle
        debug_launcher(collect_garbage_fn, (str(tmp_path),), num_processes=2)
    finally:
        gc.enable()
        gc.collect()
    assert sorted(p.name for p in tmp_path.glob("rank*_done")) == ["rank0_done", "rank1_done"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_processes", [0, -1, 1.5, "2"])
def test_refuses_bad_process_counts(tmp_path, num_processes):
    with pytest.raises(LaunchError, match=r"^num_processes must be a whole number of at least 1, got"):
        notebook_launcher(record_call, (str(tmp_path),), num_processes=num_processes)
    with pytest.raises(LaunchError, match=r"^num_processes must be"):
        debug_launcher(record_call, (str(tmp_path),), num_processes=num_processes)
    assert not (tmp_path / "called").exists()


@pytest.mark.timeout(60)
def test_refuses_other_impossible_launches(tmp_path, monkeypatch, no_fp8_backend):
    args = (str(tmp_path),)
    with pytest.raises(LaunchError, match="mixed_precision='fp8' needs torchao"):
        notebook_launcher(record_call, args, num_processes=2, mixed_precision="fp8")
    with pytest.raises(LaunchError, match="use_port must be a port number"):
        notebook_launcher(record_call, args, num_processes=2, use_port="http")
    with pytest.raises(LaunchError, match="node_rank must be between 0 and num_nodes - 1 = 1, got 2"):
        notebook_launcher(record_call, args, num_processes=2, num_nodes=2, node_rank=2)

    with socket.socket() as busy:  # a port something listens on
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(LaunchError, match=f"port {port} on 127.0.0.1 is already in use"):
            notebook_launcher(record_call, args, num_processes=2, use_port=port)

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(LaunchError, match=r"^CUDA was already initialised in this process, so forked workers"):
        notebook_launcher(record_call, args, num_processes=2, use_port=find_free_port())
    assert not (tmp_path / "called").exists()


@pytest.mark.timeout(60)
def test_refuses_when_this_process_already_has_a_process_group(tmp_path):
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group already exists in this pytest process")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1)
    try:
        with pytest.raises(LaunchError, match="already belongs to a process group"):
            notebook_launcher(record_call, (str(tmp_path),), num_processes=2, use_port=find_free_port())
    finally:
        dist.destroy_process_group()
    assert not (tmp_path / "called").exists()


@pytest.mark.timeout(60)
def test_one_process_runs_in_this_process_with_the_spec(tmp_path):
    environ_before = dict(os.environ)
    assert notebook_launcher(record_call, (str(tmp_path),), mixed_precision="fp16") is None  # no GPUs: 1 process
    called = json.loads((tmp_path / "called").read_text())
    assert called["pid"] == os.getpid()
    assert json.loads(called["spec"])["mixed_precision"] == "fp16"
    assert dict(os.environ) == environ_before

    debug_launcher(record_call, (str(tmp_path),), num_processes=1)
    assert json.loads(json.loads((tmp_path / "called").read_text())["spec"])["cpu"] is True

    def raises() -> None:
        raise KeyError("in-process errors keep their type")

    with pytest.raises(KeyError, match="keep their type"):
        notebook_launcher(raises, num_processes=1)


# -- from a real Jupyter kernel --------------------------------------------------------------------
NOTEBOOK_CELLS = [
    """
    import json, os
    import torch
    from hasten import notebook_launcher
    from hasten.launch.plan import find_free_port
    torch.randn(64, 64) @ torch.randn(64, 64)  # the kernel used torch before forking
    """,
    # defined inline: not importable by name from any module, so only fork can run it
    """
    def train(steps):
        from hasten import Accelerator
        accelerator = Accelerator()
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = accelerator.prepare(model, optimizer)
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(100 + accelerator.process_index))
        for _ in range(steps):
            optimizer.zero_grad()
            accelerator.backward(model(x).pow(2).mean())
            optimizer.step()
        params = [round(v, 6) for p in model.parameters() for v in p.detach().flatten().tolist()]
        print("RESULT " + json.dumps({"rank": accelerator.process_index, "world": accelerator.num_processes,
                                      "params": params}), flush=True)

    notebook_launcher(train, (3,), num_processes=2, use_port=find_free_port())
    print("LAUNCH RETURNED")
    """,
    """
    def broken():
        from hasten import Accelerator
        accelerator = Accelerator()
        accelerator.wait_for_everyone()
        if accelerator.process_index == 1:
            raise ValueError("boom from a notebook cell")
        accelerator.wait_for_everyone()

    notebook_launcher(broken, num_processes=2, use_port=find_free_port())
    """,
    # the kernel is still usable after a failed launch
    """
    notebook_launcher(train, (1,), num_processes=2, use_port=find_free_port())
    print("SECOND LAUNCH RETURNED")
    """,
]


def _stream_text(cell) -> str:
    return "".join(out.get("text", "") for out in cell.get("outputs", []) if out.get("output_type") == "stream")


@pytest.mark.timeout(180)
def test_notebook_launcher_from_a_jupyter_kernel(tmp_path, monkeypatch):
    pytest.importorskip("ipykernel", reason="ipykernel is not installed (pip install -e .[test])")
    nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install -e .[test])")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (pip install -e .[test])")

    # a kernel spec for exactly this interpreter (the one with hasten installed)
    kernel_dir = tmp_path / "jupyter" / "kernels" / "hasten-test"
    kernel_dir.mkdir(parents=True)
    (kernel_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "hasten test", "language": "python",
    }))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")

    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(textwrap.dedent(code).strip()) for code in NOTEBOOK_CELLS]
    )
    client = nbclient.NotebookClient(notebook, timeout=120, startup_timeout=60, kernel_name="hasten-test",
                                     allow_errors=True, resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    cells = notebook.cells

    for index in (0, 1, 3):
        errors = [out for out in cells[index].outputs if out.get("output_type") == "error"]
        assert not errors, f"cell {index} failed: {errors}"

    # both ranks printed their results into the cell's output, and DDP kept them equal
    training = _stream_text(cells[1])
    results = {}
    for match in re.finditer(r"RESULT (\{[^{}]*\})", training):  # the ranks' lines may interleave
        result = json.loads(match.group(1))
        results[result["rank"]] = result
    assert sorted(results) == [0, 1], training
    assert results[0]["world"] == results[1]["world"] == 2
    assert results[0]["params"] == results[1]["params"], training
    assert len(results[0]["params"]) == 5
    assert "LAUNCH RETURNED" in training

    # the failing cell shows the root cause: rank 1 and its message, with the cell's own frame
    errors = [out for out in cells[2].outputs if out.get("output_type") == "error"]
    assert len(errors) == 1, cells[2].outputs
    error = errors[0]
    assert error["ename"] == "WorkerFailedError"
    assert error["evalue"].startswith("rank 1 of 2 failed with ValueError: boom from a notebook cell"), error["evalue"]
    assert 'raise ValueError("boom from a notebook cell")' in error["evalue"]
    assert "rank 0 of" not in error["evalue"]

    assert "SECOND LAUNCH RETURNED" in _stream_text(cells[3])
    assert _stream_text(cells[3]).count("RESULT ") == 2
