"""The parts of an elastic run that need no second machine: what a size means, the launch, the worker's recipe,
the re-formation line, periodic checkpoints and the launcher's watch of the rendezvous store (in-process)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, ProjectConfiguration
from hasten.core.errors import ConfigError
from hasten.facade.elastic import ElasticRun, elastic_run, read_reached, record_reached, reformation
from hasten.launch.config import from_dict
from hasten.launch.elastic import StoreWatch, elastic_spec, store_lost
from hasten.launch.plan import LaunchPlan
from hasten.options import GradientAccumulationPlugin
from hasten.process.elastic import ElasticSizeError, ElasticSizes, parse_machines
from hasten.process.launch_spec import SPEC_ENV_VAR, LaunchSpec


# ---------------------------------------------------------------------------------------------- what a size means
@pytest.mark.parametrize(("text", "expected"), [("2", (2, 2)), (3, (3, 3)), ("1:4", (1, 4)), (" 2:2 ", (2, 2))])
def test_num_machines_is_a_number_or_a_range(text, expected):
    assert parse_machines(text) == expected


@pytest.mark.parametrize("text", ["0", "3:1", "a:b", "1:", "0:2"])
def test_a_bad_machine_range_is_one_sentence(text):
    with pytest.raises(ElasticSizeError, match="--num_machines"):
        parse_machines(text)


def test_every_size_deals_the_micro_batches_of_a_step_and_weights_them_so_the_mean_is_over_all():
    sizes = ElasticSizes(min_processes=2, max_processes=8, processes_per_machine=2)
    assert sizes.sizes() == [2, 4, 6, 8]
    # 8 processes x accumulation 1 = 8 micro-batches a step; 6 processes: two take 2, four take 1 (no size refused)
    layouts = [sizes.layout(6, rank, accumulation=1) for rank in range(6)]
    assert [layout.own() for layout in layouts] == [2, 2, 1, 1, 1, 1]
    assert all(layout.most == 2 and layout.divisor == 8 / 6 for layout in layouts)
    # the weights (P / M per micro-batch, averaged over P processes) sum to one step's mean
    assert sum(layout.own() / layout.divisor for layout in layouts) / 6 == pytest.approx(1.0)
    # each micro-batch of a step exactly once, over the processes
    owned = sorted(j for layout in layouts for j in range(8) if layout.owner(j) == layout.rank)
    assert owned == list(range(8))
    assert [sizes.layout(n, 0, 3).own() for n in sizes.sizes()] == [12, 6, 4, 3]
    with pytest.raises(ElasticSizeError, match="outside its range"):
        sizes.layout(10, 0)


def test_a_process_knows_where_each_of_its_micro_batches_ends_a_step_and_when_it_owes_a_filler():
    from hasten.process.elastic import ElasticLayout

    # MAX 3 x accumulation 3 = 9 micro-batches a step; 2 processes: rank 0 takes 5, rank 1 takes 4 (+ a filler)
    zero, one = (ElasticLayout(max_processes=3, processes=2, rank=r, accumulation=3) for r in (0, 1))
    total = 24  # a pass of 24 micro-batches: steps of 9, 9 and a last one of 6
    assert [zero.at(i, total).ends_step for i in range(zero.own_before(total))] == \
        [False] * 4 + [True] + [False] * 4 + [True] + [False] * 2 + [True]
    assert [(m.step, m.short_by) for m in (one.at(i, total) for i in range(one.own_before(total))) if m.ends_step] \
        == [(0, 1), (1, 1), (2, 0)]  # the last step (6 micro-batches) is even: no filler
    assert zero.own_before(total) + one.own_before(total) == total
    # a checkpoint inside a step resumes at the step's start; right after an optimizer step, at the next one
    assert one.step_start(6, total, stepped=False) == 9 and one.step_start(8, total, stepped=True) == 18


def test_the_worker_accumulates_its_share_of_the_step_at_any_size():
    spec = LaunchSpec(elastic={"min_processes": 1, "max_processes": 4, "processes_per_machine": 1})
    plugin, run, batch = elastic_run(spec, 2, 0, GradientAccumulationPlugin(num_steps=3))
    assert plugin.num_steps == 6 and run.accumulation == 3 and run.scheduler_steps == 4 and batch is None
    plugin, run, _ = elastic_run(spec, 3, 2, GradientAccumulationPlugin(num_steps=1))  # 4 micro-batches on 3: 2,1,1
    assert plugin.num_steps == 1 and run.layout.most == 2
    with pytest.raises(ValueError, match="outside its range"):
        elastic_run(spec, 5, 0, GradientAccumulationPlugin(num_steps=12))
    with pytest.raises(ValueError, match="sync_with_dataloader"):
        elastic_run(spec, 2, 0, GradientAccumulationPlugin(num_steps=2, sync_with_dataloader=False))
    plugin, run, _ = elastic_run(LaunchSpec(), 2, 0, GradientAccumulationPlugin(num_steps=3))
    assert run is None and plugin.num_steps == 3  # not elastic: untouched


def test_an_elastic_accelerator_steps_as_the_run_at_max_size(monkeypatch):
    spec = LaunchSpec(elastic={"min_processes": 1, "max_processes": 2, "processes_per_machine": 1})
    monkeypatch.setenv(SPEC_ENV_VAR, spec.to_env()[SPEC_ENV_VAR])
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    assert accelerator.gradient_accumulation_steps == 4  # 2 at 2 processes -> 4 at 1
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    loader = DataLoader(TensorDataset(torch.ones(8, 2)), batch_size=1)
    model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, loader)
    for (x,) in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(x).sum())
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    # 8 batches = 2 optimizer steps; each advances the schedule 2 times (the processes at MAX), as Accelerate at 2
    assert scheduler.scheduler.last_epoch == 4
    # the setter sets the recipe (the accumulation at MAX); this process's share of a step follows
    accelerator.gradient_accumulation_steps = 3
    assert accelerator.gradient_accumulation_steps == 6 and accelerator._elastic.accumulation == 3


@pytest.mark.parametrize("accumulate", [True, False])
def test_a_loop_with_or_without_accumulate_steps_once_per_step_at_a_smaller_size(monkeypatch, accumulate):
    # at 1 process of MAX 2 a step is 2 micro-batches here; a loop without accumulate() (Accelerate's examples
    # without accumulation) must step where the dealing ends a step, not at every micro-batch
    import contextlib

    spec = LaunchSpec(elastic={"min_processes": 1, "max_processes": 2, "processes_per_machine": 1})
    monkeypatch.setenv(SPEC_ENV_VAR, spec.to_env()[SPEC_ENV_VAR])
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    data = TensorDataset(torch.arange(8.0).reshape(4, 2).repeat(2, 1))
    loader = DataLoader(data, batch_size=1)
    model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, loader)
    before = accelerator.gradient_state.optimizer_steps
    for (x,) in loader:
        with accelerator.accumulate(model) if accumulate else contextlib.nullcontext():
            accelerator.backward(model(x).sum())
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    assert accelerator.gradient_state.optimizer_steps - before == 4  # 8 micro-batches, 2 a step
    assert scheduler.scheduler.last_epoch == 8  # each step advances the schedule 2 times (the processes at MAX)
    # the same numbers either way: each step's gradient is the mean of its 2 micro-batches'
    torch.manual_seed(0)
    reference = torch.nn.Linear(2, 1)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    ref_scheduler = torch.optim.lr_scheduler.LambdaLR(ref_optimizer, lambda step: 1.0 / (step + 1))
    rows = data.tensors[0]
    for step in range(4):
        (reference(rows[2 * step:2 * step + 2]).sum() / 2).backward()
        ref_optimizer.step()
        ref_optimizer.zero_grad()
        ref_scheduler.step()
        ref_scheduler.step()
    unwrapped = accelerator.unwrap_model(model)
    assert torch.allclose(unwrapped.weight, reference.weight) and torch.allclose(unwrapped.bias, reference.bias)


def test_an_elastic_run_refuses_in_one_sentence_the_loader_settings_it_cannot_deal_at_an_uneven_size(monkeypatch):
    from hasten.data import prepare_data_loader
    from hasten.process.elastic import ElasticLayout

    uneven = _Run(ElasticLayout(max_processes=3, processes=2, rank=0, accumulation=1))
    loader = DataLoader(TensorDataset(torch.ones(8, 2)), batch_size=2)
    for settings, named in (({"split_batches": True}, "split_batches=True"),
                            ({"even_batches": False}, "even_batches=False")):
        with pytest.raises(ValueError, match=f"which {named} does not allow at 2 of 3 processes"):
            prepare_data_loader(loader, num_processes=2, process_index=0, elastic=uneven, **settings)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(8))

    with pytest.raises(ValueError, match="which an IterableDataset does not allow"):
        prepare_data_loader(DataLoader(Stream(), batch_size=2), num_processes=2, process_index=0, elastic=uneven)
    even = _Run(ElasticLayout(max_processes=4, processes=2, rank=0, accumulation=1))  # 2 divides 4: plain sharding
    assert len(prepare_data_loader(loader, num_processes=2, process_index=0, elastic=even, split_batches=True)) == 4


# ---------------------------------------------------------------------------------------------- the re-formation line
def test_the_reformation_line_names_who_left_the_new_size_and_the_steps_redone():
    run = ElasticRun(ElasticSizes(1, 2, 1), accumulation=1, world=1, machines=["a/0"])
    line, record = reformation(run, {"optimizer_steps": 10, "processes": 2, "machines": ["a/0", "b/1"]}, "ck_5", 13)
    assert "2 -> 1 processes" in line and "left: b/1" in line and "gradient accumulation 2" in line
    assert "resumed from ck_5 at optimizer step 10" in line and "3 step(s) redone" in line
    assert record == {"elastic/processes": 1, "elastic/machines": 1, "elastic/gradient_accumulation_steps": 2,
                      "elastic/resumed_step": 10, "elastic/steps_redone": 3}
    grown = ElasticRun(ElasticSizes(1, 2, 1), accumulation=1, world=2, machines=["a/0", "c/1"])
    line, _ = reformation(grown, {"optimizer_steps": 12, "processes": 1, "machines": ["a/0"]}, "ck_6", None)
    assert "1 -> 2 processes" in line and "joined: c/1" in line and "0 step(s) redone" in line
    same = reformation(grown, {"optimizer_steps": 12, "processes": 2, "machines": ["a/0", "c/1"]}, "ck_6", 12)
    assert same is None  # a restart of the same group is no re-formation


def test_how_far_a_group_got_survives_it(tmp_path):
    assert read_reached(str(tmp_path)) is None
    record_reached(str(tmp_path), 17, processes=2, machines=["a/0", "b/1"])
    reached = read_reached(str(tmp_path))
    assert reached == {"optimizer_steps": 17, "processes": 2, "machines": ["a/0", "b/1"]}
    assert not list(tmp_path.glob("*.tmp"))
    # a group of 2 that broke up before writing a checkpoint of its own: the line names it, not the checkpoint's group
    run = ElasticRun(ElasticSizes(1, 2, 1), accumulation=1, world=1, machines=["a/0"])
    line, _ = reformation(run, {"optimizer_steps": 15, "processes": 1, "machines": ["a/0"]}, "ck_7", reached)
    assert "2 -> 1 processes" in line and "left: b/1" in line and "2 step(s) redone" in line


# ---------------------------------------------------------------------------------------------- the launch
def _plan(**settings) -> LaunchPlan:
    base = dict(target=__file__, num_processes=4, num_machines=2, min_machines=1, main_process_ip="127.0.0.1",
                main_process_port=29555, max_restarts=3)
    return LaunchPlan(**{**base, **settings}).validate(check_port=False)


def test_an_elastic_plan_is_torchruns_nnodes_range_on_the_main_machines_store():
    plan = _plan()
    argv = plan.torchrun_argv()
    assert argv[:5] == ["--nnodes=1:2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                        "--rdzv-endpoint=127.0.0.1:29555", "--rdzv-id=hasten"]
    assert "--max-restarts=3" in argv and "--rdzv-conf=last_call_timeout=10,is_host=1" in argv
    # on one host (loopback) machine 0 holds the store whatever order the commands start in; the others connect
    assert "--rdzv-conf=last_call_timeout=10,is_host=0" in _plan(machine_rank=1).torchrun_argv()
    assert plan.restarts_by_launcher == 0  # the agents re-form the group; a restart by this launcher alone could not
    # (the liveness limit is the launchers' now: the processes' collectives keep the user's timeout)
    assert plan.spec.elastic == {"min_processes": 2, "max_processes": 4, "processes_per_machine": 2}
    env = plan.worker_env({})
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1" and env["HASTEN_MACHINE"].endswith("/0")
    conf = _plan(rdzv_conf={"last_call_timeout": 3, "join_timeout": 60}).torchrun_argv()
    assert "--rdzv-conf=last_call_timeout=3,join_timeout=60,is_host=1" in conf
    assert not LaunchPlan(target=__file__, num_processes=2).elastic


def test_a_remote_main_machine_hosts_the_store_and_each_machine_advertises_its_own_address():
    argv = _plan(main_process_ip="192.0.2.77").torchrun_argv()  # an address this machine does not carry
    assert any(a.startswith("--rdzv-conf=") and "is_host=0" in a for a in argv), argv


def test_the_command_line_and_the_config_file_take_a_range(tmp_path):
    config = from_dict({"num_machines": "1:3", "num_processes": 6, "main_process_ip": "10.0.0.1"})
    assert (config.min_machines, config.num_machines, config.processes_per_machine) == (1, 3, 2)
    with pytest.raises(ConfigError, match="MIN must be at least 1"):
        from_dict({"num_machines": "3:2", "main_process_ip": "10.0.0.1"})
    with pytest.raises(ConfigError, match="mpirun"):
        from_dict({"num_machines": "1:2", "num_processes": 2, "main_process_ip": "10.0.0.1", "mpirun": True})
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    dry = subprocess.run([sys.executable, "-m", "hasten", "launch", "--dry_run", "--num_machines", "1:2",
                          "--num_processes", "2", "--main_process_ip", "127.0.0.1", "--max_restarts", "2", str(script)],
                         capture_output=True, text=True, timeout=120, env={"HASTEN_CONFIG_FILE": "/nonexistent",
                                                                              "PATH": "/usr/bin:/bin"})
    assert dry.returncode == 0, dry.stderr
    assert "--nnodes=1:2" in dry.stdout and "--max-restarts=2" in dry.stdout and '"elastic": {' in dry.stdout
    bad = subprocess.run([sys.executable, "-m", "hasten", "launch", "--num_machines", "2:1", str(script)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "MIN must be at least 1 and at most MAX" in bad.stderr
    # every size of every range holds the global batch: the README's range is taken as it is
    readme = subprocess.run([sys.executable, "-m", "hasten", "launch", "--dry_run", "--num_machines", "1:4",
                             "--num_processes", "32", "--main_process_ip", "127.0.0.1", "--gradient_accumulation_steps",
                             "1", str(script)], capture_output=True, text=True, timeout=120)
    assert readme.returncode == 0 and "--nnodes=1:4" in readme.stdout, readme.stderr


def test_the_store_watch_says_so_when_the_store_is_unreachable_and_stays_quiet_while_it_answers():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead_port = closed.getsockname()[1]  # nothing listens once the socket is closed
    lines: list[str] = []
    watch = StoreWatch("127.0.0.1", dead_port, limit=0.6, on_lost=lines.append, every=0.05)
    start = time.monotonic()
    watch.start()
    watch.join(5.0)
    assert lines and "could not reach the elastic run's rendezvous store" in lines[0]
    assert time.monotonic() - start <= 0.6 + 0.5  # the verdict comes early enough to stop within the limit
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.settimeout(0.2)

        def answer() -> None:  # a store accepts every connection
            while not quiet._stop.is_set():
                with contextlib.suppress(OSError):
                    server.accept()[0].close()

        quiet = StoreWatch("127.0.0.1", server.getsockname()[1], limit=0.3, on_lost=lines.append, every=0.05)
        acceptor = threading.Thread(target=answer, daemon=True)
        acceptor.start()
        quiet.start()
        time.sleep(0.8)
        quiet.stop()
        quiet.join(2.0)
        acceptor.join(2.0)
    assert quiet.verdict is None and len(lines) == 1
    assert "cannot leave an elastic run" in store_lost(_plan(), ConnectionError("refused"))


def test_the_spec_carries_the_sizes_of_an_elastic_run():
    # (not the liveness limit: an elastic run's process group keeps the user's timeout, tests/test_elastic_liveness.py)
    spec = LaunchSpec(elastic=elastic_spec(_plan(liveness_timeout=20.0)))
    assert spec.elastic_sizes() == ElasticSizes(2, 4, 2) and "liveness_timeout" not in spec.elastic


# ---------------------------------------------------------------------------------------------- periodic checkpoints
def test_periodic_checkpoints_need_automatic_naming():
    with pytest.raises(ValueError, match="automatic_checkpoint_naming=True"):
        ProjectConfiguration("runs", save_every_n_steps=10)
    with pytest.raises(ValueError, match="save_every_n_steps must be an integer"):
        ProjectConfiguration("runs", automatic_checkpoint_naming=True, save_every_n_steps=0)


def _train(project, steps: int, accumulation: int = 1, resume: bool = False) -> Accelerator:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation, project_config=project)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(steps * accumulation, 3)), batch_size=1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if resume:
        accelerator.load_state()
    for (x,) in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(x).sum())
            optimizer.step()
            optimizer.zero_grad()
    accelerator.end_training()
    return accelerator


def test_periodic_checkpoints_every_n_optimizer_steps_count_steps_across_a_resume(tmp_path):
    project = ProjectConfiguration(str(tmp_path), automatic_checkpoint_naming=True, save_every_n_steps=2)
    _train(project, steps=5, accumulation=2)  # 5 optimizer steps: saves after steps 2 and 4
    saved = sorted((tmp_path / "checkpoints").iterdir())
    assert [p.name for p in saved] == ["checkpoint_0", "checkpoint_1"]
    manifests = [json.loads((p / "hasten_checkpoint.json").read_text()) for p in saved]
    assert [m["run"]["optimizer_steps"] for m in manifests] == [2, 4]
    assert all(m["step"] % 2 == 0 and m["gradient_accumulation_steps"] == 2 for m in manifests)  # whole cycles
    again = ProjectConfiguration(str(tmp_path), automatic_checkpoint_naming=True, save_every_n_steps=2)
    # counts on from the checkpoint's step 4 (the loader starts its epoch afresh: no use_stateful_dataloader)
    accelerator = _train(again, steps=5, accumulation=2, resume=True)
    assert accelerator._boundary_watch.optimizer_steps == 9
    newest = [json.loads((tmp_path / "checkpoints" / f"checkpoint_{i}" / "hasten_checkpoint.json").read_text())
              for i in (2, 3)]
    assert [m["run"]["optimizer_steps"] for m in newest] == [6, 8]


# ---------------------------------------------------------------------------------------------- the dealt batches
class _Run:
    """What an elastic loader reads of the run: the layout now, and whether the models train."""

    def __init__(self, layout, training: bool = True) -> None:
        self.layout, self.training = layout, training

    def training_pass(self) -> bool:
        return self.training


def _dealt(processes: int, accumulation: int, samples: int, training: bool = True) -> list[list[list[int]]]:
    from torch.utils.data import BatchSampler

    from hasten.data.elastic import ElasticBatchSampler
    from hasten.process.elastic import ElasticLayout

    batches = []
    for rank in range(processes):
        layout = ElasticLayout(max_processes=3, processes=processes, rank=rank, accumulation=accumulation)
        sampler = ElasticBatchSampler(BatchSampler(range(samples), batch_size=2, drop_last=False),
                                      _Run(layout, training))
        sampler.begin_pass(False)
        batches.append(list(sampler))
        assert len(sampler) == len(batches[-1])
    return batches


def test_a_training_pass_deals_the_run_s_global_order_padded_at_max_and_an_evaluation_pass_is_sharded_plainly():
    # 3 processes at MAX, batches of 2 over 14 samples: 7 batches, padded to 9 (the uninterrupted run's windows of 3)
    at_max = _dealt(3, 1, 14)
    global_order = [batch for window in zip(*at_max) for batch in window]
    assert [i for b in global_order for i in b] == list(range(14)) + [0, 1, 2, 3]
    # 2 processes: step j of each 3 goes to j % 2, the same batches as at MAX, each once
    two = _dealt(2, 1, 14)
    assert two[0] == [global_order[g] for g in range(9) if g % 3 in (0, 2)]
    assert two[1] == [global_order[g] for g in range(9) if g % 3 == 1]
    one = _dealt(1, 1, 14)
    assert one[0] == global_order
    # model.eval(): plain sharding over the processes there are (as many batches each, padded at this size)
    evaluation = _dealt(2, 1, 14, training=False)
    assert [len(b) for b in evaluation] == [4, 4] and evaluation[0][0] == [0, 1] and evaluation[1][0] == [2, 3]


def test_an_elastic_loader_saves_where_the_step_under_way_began_and_resumes_there_at_another_size():
    from hasten.data import prepare_data_loader
    from hasten.process.elastic import ElasticLayout
    from hasten.runtime.gradient_state import GradientState

    GradientState._reset_state()
    state = GradientState()
    data = TensorDataset(torch.arange(24))

    def loader(processes: int, rank: int):
        layout = ElasticLayout(max_processes=2, processes=processes, rank=rank, accumulation=3)
        return prepare_data_loader(DataLoader(data, batch_size=2), num_processes=processes, process_index=rank,
                                   gradient_state=state, elastic=_Run(layout))

    one = loader(1, 0)  # 6 micro-batches a step on one process
    batches = iter(one)
    for _ in range(8):  # a step, and 2 micro-batches into the next
        next(batches)
    saved = one.position_state()
    assert (saved["yielded"], saved["global_batch_size"]) == (6, 2)  # the step under way began at micro-batch 6
    assert state.position.micro_batch.step == 1 and not state.position.micro_batch.ends_step
    for _ in range(4):  # the step's last micro-batch
        next(batches)
    assert one.position_state()["yielded"] == 6 and state.position.micro_batch.ends_step
    state.optimizer_steps += 1  # ... once the optimizer has stepped, a checkpoint resumes at the next step
    assert one.position_state()["yielded"] == 12
    rest = []
    for rank in range(2):  # two processes resume from micro-batch 6: 3 each a step, the rest of the pass
        resumed = loader(2, rank)
        resumed.load_position(saved)
        rest.append([b[0].tolist() for b in resumed])
    assert sorted(i for part in rest for b in part for i in b) == list(range(12, 24))
    assert rest[0][0] == [12, 13] and rest[1][0] == [14, 15]
    GradientState._reset_state()
