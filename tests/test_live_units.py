"""Live recovery's pieces without torchft or processes: the quorum's layout, the reducer, and the step rule through a
real Accelerator with a stand-in live group (a failed commit at step 3 is dealt again; every sample once; LR as an
uninterrupted run's)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import hasten.process.live as live_pkg
from hasten import Accelerator
from hasten.process.launch_spec import SPEC_ENV_VAR, LaunchSpec
from hasten.process.live import LiveQuorum, LiveReducer, live_line


# ------------------------------------------------------------------------------------------------- pure pieces
def test_a_quorum_gives_the_layout_of_its_size():
    quorum = LiveQuorum(step=3, replicas=2, replica_rank=1, quorum_id=5)
    layout = quorum.layout(max_processes=2, accumulation=2)
    assert (layout.processes, layout.rank, layout.own(), layout.divisor) == (2, 1, 2, 2.0)
    alone = LiveQuorum(step=3, replicas=1, replica_rank=0, quorum_id=6).layout(max_processes=2, accumulation=2)
    assert (alone.own(), alone.divisor) == (4, 4.0)
    assert quorum.rank(processes_per_machine=4, local_rank=3) == 7


def test_the_line_is_printed_only_when_the_group_changes():
    a = LiveQuorum(step=3, replicas=2, replica_rank=0, quorum_id=1)
    assert live_line(a, LiveQuorum(step=4, replicas=2, replica_rank=0, quorum_id=1)) is None
    line = live_line(a, LiveQuorum(step=3, replicas=1, replica_rank=0, quorum_id=2), seconds=1.0, redone=1)
    assert "2 -> 1 machine(s) at optimizer step 3" in line and "1 step attempt(s) dealt again" in line


class _Averaging:
    """Two machines whose other one has gradient `other` (flat): the group's average, or a failure."""

    def __init__(self, other: torch.Tensor | None) -> None:
        self.other, self.seen = other, None

    def allreduce(self, flat: torch.Tensor) -> bool:
        self.seen = flat.clone()
        if self.other is None:
            flat.fill_(float("nan"))
            return False
        flat.add_(self.other).div_(2)
        return True


def test_the_reducer_averages_in_parameter_order_and_fills_missing_gradients():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1, 2))
    a.grad = torch.tensor([1.0, 2.0])  # b has no gradient: zeros, so every machine's flat layout is the same
    group = _Averaging(torch.tensor([3.0, 4.0, 2.0, 2.0]))
    assert LiveReducer([a, b, a], group).reduce()
    assert group.seen.tolist() == [1.0, 2.0, 0.0, 0.0]
    assert a.grad.tolist() == [2.0, 3.0] and b.grad.tolist() == [[1.0, 1.0]]
    failing = LiveReducer([a], _Averaging(None))
    assert failing.reduce() is False and failing.failed


# ------------------------------------------------------------------------------------------- the step rule
class FakeGroup:
    """A stand-in `LiveGroup`: `sizes(step, attempt)` -> (replicas, replica_rank); the steps in `fail` fail once."""

    def __init__(self, fail=(), sizes=lambda step, attempt: (1, 0)) -> None:
        self.fail, self.sizes = set(fail), sizes
        self.step = self.attempt = 0
        self.quorums: list[LiveQuorum] = []

    def register_state(self, save, load) -> None:
        self.save, self.load = save, load

    def begin_step(self) -> LiveQuorum:
        replicas, rank = self.sizes(self.step, self.attempt)
        quorum = LiveQuorum(self.step, replicas, rank, quorum_id=self.attempt)
        self.quorums.append(quorum)
        return quorum

    def allreduce(self, flat) -> bool:
        return True  # (alone, or the stand-in peer's gradient equals this one's: the average is the tensor)

    def commit(self) -> bool:
        self.attempt += 1
        if self.step in self.fail:
            self.fail.discard(self.step)
            return False
        self.step += 1
        return True

    def close(self) -> None:
        pass


def _train(monkeypatch, group: FakeGroup | None, samples: int = 32, accumulate: bool = True, num_workers: int = 0,
           project=None, resume: str | None = None, batchnorm: bool = False, epochs: int = 1, seeded: bool = False,
           registered=(), on_start=None):
    """The unchanged Accelerate loop; returns (micro-batch ids per attempt, committed ids per step, lr per step, params).
    `project`: the `ProjectConfiguration`; `resume`: a checkpoint loaded before the loop; `group` None: the same
    elastic run (MAX 2) without live recovery, on one process; `seeded`: the loader shuffles with its own generator."""
    spec = LaunchSpec(elastic={"min_processes": 1, "max_processes": 2, "processes_per_machine": 1},
                      live={"lighthouse": "unused:0", "replica": 0} if group is not None else None)
    monkeypatch.setenv(SPEC_ENV_VAR, spec.to_env()[SPEC_ENV_VAR])
    monkeypatch.setattr(live_pkg, "LiveGroup", lambda *args, **kwargs: group)
    torch.manual_seed(0)
    from hasten import DataLoaderConfiguration

    # (a resumed loader continues where the checkpoint was taken: Accelerate's stateful-loader setting)
    loaders = DataLoaderConfiguration(use_stateful_dataloader=project is not None)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2, project_config=project, dataloader_config=loaders)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 1)) if batchnorm \
        else torch.nn.Linear(3, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + 0.1 * s))
    data = TensorDataset(torch.arange(samples), torch.randn(samples, 3), torch.randn(samples, 1))
    loader = DataLoader(data, batch_size=2, shuffle=True, num_workers=num_workers,
                        generator=torch.Generator().manual_seed(5) if seeded else None)
    model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, loader)
    accelerator.register_for_checkpointing(*registered)
    if resume is not None:
        accelerator.load_state(resume)
    if on_start is not None:
        on_start(accelerator, loader)
    attempts, committed, lrs, pending = [], [], [], []
    for ids, x, y in (batch for _ in range(epochs) for batch in loader):
        with accelerator.accumulate(model) if accumulate else contextlib.nullcontext():
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            pending.append(ids.tolist())
            was_sync = accelerator.sync_gradients
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if was_sync:
            attempts.append(pending)
            if accelerator.sync_gradients:
                committed.append(sorted(i for batch in pending for i in batch))
                lrs.append(scheduler.get_last_lr()[0])
            pending = []
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    from hasten.checkpointing.background import wait_pending

    wait_pending()  # (a periodic save in the background is finished)
    return attempts, committed, lrs, params, accelerator


def test_a_failed_step_is_dealt_again_and_every_sample_trains_once(monkeypatch):
    _, committed_ref, lrs_ref, params_ref, first = _train(monkeypatch, FakeGroup())
    before = first.gradient_state.optimizer_steps
    group = FakeGroup(fail={3})
    attempts, committed, lrs, params, accelerator = _train(monkeypatch, group)
    assert len(attempts) == len(committed) + 1 == 5  # 32 samples / (4 micro-batches x 2) = 4 steps, one redone
    assert attempts[3] == attempts[4]  # the loader dealt step 3 again before anything else
    assert committed == committed_ref  # every committed step trained the uninterrupted run's samples
    assert sorted(i for step in committed for i in step) == list(range(32))  # every sample once
    assert lrs == lrs_ref  # the scheduler stepped on commits only
    assert torch.allclose(params, params_ref, rtol=1e-6, atol=0)
    assert accelerator.gradient_state.optimizer_steps - before == 4  # (the counter is the process's)


class _Count:
    def __init__(self, done: int = 0) -> None:
        self.done = done

    def state_dict(self) -> dict:
        return {"done": self.done, "history": (self.done, [float(self.done)])}

    def load_state_dict(self, state: dict) -> None:
        self.done = int(state["done"])


def test_a_joiner_receives_the_objects_registered_for_checkpointing_with_the_rest(monkeypatch):
    # a script's own step counter or EMA model (register_for_checkpointing): a joiner that kept its own went on with
    # stale values (the script's step labels were off by the steps it missed)
    from hasten.process.live.transport import describe, rebuild

    peer = FakeGroup()
    _, _, _, params, _ = _train(monkeypatch, peer, registered=[_Count(7)])
    layout, tensors = describe(peer.save(), step=4)  # (through the heal's wire format)
    joiner_count, joiner = _Count(0), FakeGroup()
    *_, accelerator = _train(monkeypatch, joiner, samples=8, registered=[joiner_count])
    joiner.load(rebuild(layout, tensors, step=4))
    assert joiner_count.done == 7
    assert torch.equal(torch.cat([p.detach().flatten() for p in accelerator._models[0].parameters()]), params)


def test_a_joiner_is_healed_at_load_state_before_the_script_reads_where_the_run_is(monkeypatch, tmp_path):
    # an epoch loop starts at the loader's epoch after load_state(): healed only at its first step, a joiner ran the
    # epochs left from its own checkpoint (here none), one pass after the others had ended
    from hasten.utils import ProjectConfiguration

    peer = FakeGroup()
    *_, kept = _train(monkeypatch, peer, epochs=2)  # (kept: the state is read from the live Accelerator)
    state = peer.save()  # (as a heal at a step of the second pass would find it: epoch 1)
    assert state["loaders"]["0"]["epoch"] == 1

    class Healing(FakeGroup):
        def begin_step(self):
            if not self.quorums:
                self.load(state)
            return super().begin_step()

    seen = []
    joiner = Healing()
    _train(monkeypatch, joiner, project=ProjectConfiguration(str(tmp_path), automatic_checkpoint_naming=True),
           on_start=lambda accelerator, loader: (accelerator.load_state(), seen.append(loader.epoch)))
    assert seen == [1] and joiner.quorums[0].quorum_id == 0  # healed inside load_state, by the first step's quorum
    assert len({q.quorum_id for q in joiner.quorums}) == len(joiner.quorums)  # (that quorum is not asked twice)


@pytest.mark.parametrize("seeded", [False, True])
def test_every_epoch_is_dealt_in_the_order_of_the_run_without_live_recovery(monkeypatch, seeded):
    # each epoch's shuffle draws from the loader's generator after torch's iterator drew its base seed there: a live
    # pass that made no iterator dealt every epoch after the first in another order (and trained other numbers)
    _, committed_ref, lrs_ref, params_ref, _ = _train(monkeypatch, None, epochs=3, seeded=seeded)
    _, committed, lrs, params, _ = _train(monkeypatch, FakeGroup(fail={5}), epochs=3, seeded=seeded)
    assert len(committed) == 12 and committed == committed_ref and lrs == lrs_ref
    assert torch.allclose(params, params_ref, rtol=1e-6, atol=0)


def test_a_failed_steps_batchnorm_updates_are_undone_before_it_is_dealt_again(monkeypatch):
    _, committed_ref, _, params_ref, reference = _train(monkeypatch, FakeGroup(), batchnorm=True)
    buffers_ref = {k: v.clone() for k, v in reference._models[0].named_buffers()}
    attempts, committed, _, params, accelerator = _train(monkeypatch, FakeGroup(fail={1, 3}), batchnorm=True)
    assert len(attempts) == len(committed) + 2 and committed == committed_ref
    buffers = dict(accelerator._models[0].named_buffers())
    assert int(buffers["1.num_batches_tracked"]) == int(buffers_ref["1.num_batches_tracked"]) == 16  # not 20
    for name, value in buffers_ref.items():
        assert torch.equal(buffers[name], value), name  # running mean and variance: the uninterrupted run's
    assert torch.allclose(params, params_ref, rtol=1e-6, atol=0)


def test_a_loop_without_accumulate_steps_where_the_dealing_ends_a_step_after_a_failed_one_too(monkeypatch):
    # Accelerate's examples without accumulation call no accumulate(): the loader's dealing says where a step ends
    # (2 micro-batches a step here), and a failed commit does not leave every later micro-batch unsynchronised
    _, committed_ref, lrs_ref, params_ref, _ = _train(monkeypatch, FakeGroup())
    attempts, committed, lrs, params, _ = _train(monkeypatch, FakeGroup(fail={1}), accumulate=False)
    assert len(attempts) == len(committed) + 1 == 5 and attempts[1] == attempts[2]
    assert committed == committed_ref and lrs == lrs_ref
    assert torch.allclose(params, params_ref, rtol=1e-6, atol=0)


def test_workers_a_live_pass_does_not_use_are_said_once(monkeypatch, capsys):
    _, committed_ref, *_ = _train(monkeypatch, FakeGroup())
    _, committed, *_ = _train(monkeypatch, FakeGroup(), num_workers=2)
    assert committed == committed_ref  # the same batches, read here
    said = [line for line in capsys.readouterr().err.splitlines() if "num_workers=2 is not used" in line]
    assert len(said) == 1


def test_periodic_checkpoints_are_written_by_the_quorums_first_machine_and_resume_a_live_run(monkeypatch, tmp_path):
    # Losing every machine at once: the newest periodic checkpoint (every 2 of the 4 steps; step 1 fails once) resumes
    # the run at its step, which the live group starts at, and the run ends as the uninterrupted one
    from hasten.checkpointing.project import list_checkpoints
    from hasten.utils import ProjectConfiguration

    def project(folder: str, every: int | None = 2):
        return ProjectConfiguration(str(tmp_path / folder), automatic_checkpoint_naming=True, save_every_n_steps=every)

    _, committed_ref, lrs_ref, params_ref, _ = _train(monkeypatch, FakeGroup())
    _, committed, lrs, params, _ = _train(monkeypatch, FakeGroup(fail={1}), project=project("first"))
    assert committed == committed_ref and lrs == lrs_ref and torch.equal(params, params_ref)  # (saving changes nothing)
    saved = list_checkpoints(tmp_path / "first" / "checkpoints")
    assert [i for i, _ in saved] == [0, 1]  # after optimizer steps 2 and 4
    _train(monkeypatch, FakeGroup(sizes=lambda step, attempt: (2, 1)), project=project("second"))
    assert list_checkpoints(tmp_path / "second" / "checkpoints") == []  # the quorum's second machine saves none

    group = FakeGroup()
    _, committed, lrs, params, accelerator = _train(monkeypatch, group, project=project("first", None),
                                                    resume=str(saved[0][1]))
    assert group.resume_step == 2  # the live group starts at the checkpoint's step (a fresh peer would heal from it)
    assert committed == committed_ref[2:] and lrs == lrs_ref[2:]  # steps 3 and 4, as in the uninterrupted run
    assert torch.allclose(params, params_ref, rtol=1e-6, atol=0)
    assert accelerator._boundary_watch.optimizer_steps == 4


def test_a_scripts_own_save_state_is_written_by_the_first_machine_only_and_each_says_where(monkeypatch, tmp_path):
    # every machine calls save_state() (Accelerate's rule: every process does); two machines writing one shared
    # folder collided ("checkpoint_0 already exists"), and every machine holds the same state: one writes it
    from hasten.checkpointing.project import list_checkpoints
    from hasten.utils import ProjectConfiguration

    folder = tmp_path / "shared"
    second = FakeGroup(sizes=lambda step, attempt: (2, 1))
    *_, accelerator = _train(monkeypatch, second, project=ProjectConfiguration(str(folder), automatic_checkpoint_naming=True))
    said = accelerator.save_state()
    assert list_checkpoints(folder / "checkpoints", complete_only=False) == []  # the quorum's second machine
    assert said == str(folder / "checkpoints" / "checkpoint_0") and accelerator.save_state(str(tmp_path / "x")) == \
        str(tmp_path / "x") and not (tmp_path / "x").exists()
    *_, accelerator = _train(monkeypatch, FakeGroup(), project=ProjectConfiguration(str(folder),
                                                                                     automatic_checkpoint_naming=True))
    assert accelerator.save_state() == said and [i for i, _ in list_checkpoints(folder / "checkpoints")] == [0]


def test_the_redone_step_is_dealt_at_the_new_size(monkeypatch):
    # two machines (this one is rank 1) until step 2 fails; then alone: step 2 again, all four micro-batches here
    sizes = lambda step, attempt: (2, 1) if attempt <= 2 else (1, 0)  # noqa: E731
    attempts, committed, _, _, _ = _train(monkeypatch, FakeGroup(fail={2}, sizes=sizes))
    assert [len(a) for a in attempts] == [2, 2, 2, 4, 4]  # odd micro-batches at P=2, all four at P=1
    assert set(map(tuple, attempts[2])) <= set(map(tuple, attempts[3]))  # the redo covers the failed share and more
    assert len(committed) == 4


def test_sigterm_inside_a_step_finishes_it_then_leaves_at_the_boundary(monkeypatch, capsys):
    import os
    import signal

    from hasten.facade.live import LeftLiveRun

    class SignalledGroup(FakeGroup):  # SIGTERM really sent to this process while step 1 is in progress
        closed = False

        def allreduce(self, flat) -> bool:
            if self.step == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            return True

        def close(self) -> None:
            self.closed = True

    monkeypatch.delenv("HASTEN_PREEMPTION_RECORD", raising=False)
    monkeypatch.setenv("HASTEN_MACHINE", "vm/1")
    before = signal.getsignal(signal.SIGTERM)
    group = SignalledGroup()
    with pytest.raises(LeftLiveRun) as left:
        _train(monkeypatch, group)
    assert group.step == 2 and group.closed  # step 1 committed with everyone, then the machine left the group
    assert len(group.quorums) == 2  # it never asked for the quorum of step 2 (its members would wait for it)
    assert left.value.code == 75 and left.value.optimizer_steps >= 2
    assert "vm/1 left the live run on SIGTERM after optimizer step" in capsys.readouterr().out
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is given back


def test_the_first_machine_saves_its_state_when_it_leaves_and_the_run_resumes_there_with_nothing_redone(monkeypatch,
                                                                                                      tmp_path):
    # a cancelled job stops every machine at once: the leave's checkpoint (automatic naming) holds the step boundary
    import os
    import signal

    from hasten.facade.live import LeftLiveRun
    from hasten.utils import ProjectConfiguration

    class SignalledGroup(FakeGroup):  # SIGTERM really sent while step 1 is in progress
        def allreduce(self, flat) -> bool:
            if self.step == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            return True

    monkeypatch.delenv("HASTEN_PREEMPTION_RECORD", raising=False)
    _, committed_ref, lrs_ref, params_ref, _ = _train(monkeypatch, FakeGroup())
    project = ProjectConfiguration(str(tmp_path), automatic_checkpoint_naming=True)
    with pytest.raises(LeftLiveRun) as left:
        _train(monkeypatch, SignalledGroup(), project=project)
    assert left.value.checkpoint and "its state is saved to" in left.value.describe()
    _, committed, lrs, params, _ = _train(monkeypatch, FakeGroup(), project=project, resume=left.value.checkpoint)
    assert committed == committed_ref[2:] and lrs == lrs_ref[2:]  # the steps after the leave's boundary, none again
    assert torch.allclose(params, params_ref, rtol=1e-6, atol=0)


def test_torchfts_flight_recorder_warning_is_not_repeated_at_every_group_change(caplog):
    import logging

    from hasten.process.live.membership import _quiet_flight_recorder

    _quiet_flight_recorder()
    _quiet_flight_recorder()  # (once: a second call adds no second filter)
    logger = logging.getLogger("torchft.manager")
    assert len(logger.filters) == 1
    with caplog.at_level(logging.WARNING, logger="torchft.manager"):
        logger.warning("[00000:x/0 - step 19] Unable to reset NCCL flight recorder recording so traces will be incorrect.")
        logger.warning("[00000:x/0 - step 19] something else")
        try:
            raise RuntimeError("Connection closed by peer [127.0.0.1]:19875")
        except RuntimeError as lost:  # (a peer killed inside the step's all-reduce: one line, no traceback)
            logger.exception(f"[00000:x/0 - step 20] got exception waiting for work {lost}")
    assert [r.getMessage() for r in caplog.records] == [
        "[00000:x/0 - step 19] something else",
        "[00000:x/0 - step 20] got exception waiting for work Connection closed by peer [127.0.0.1]:19875"]
    assert "Traceback" not in caplog.text


# ------------------------------------------------------------------------------- the launcher's side (no processes)
def _live_plan(**overrides):
    from hasten.launch.plan import LaunchPlan

    settings = dict(target=__file__, num_processes=2, num_machines=2, min_machines=1, machine_rank=1,
                    main_process_ip="127.0.0.1", main_process_port=29500, live=True)
    return LaunchPlan(**{**settings, **overrides})


@pytest.fixture
def torchft_present(monkeypatch):
    import hasten.launch.live as launch_live

    monkeypatch.setattr(launch_live, "find_spec", lambda name: object())


def test_a_live_launch_is_one_local_process_per_machine_that_finds_the_lighthouse(torchft_present):
    from hasten.launch.live import local_plan

    plan = _live_plan().validate(check_port=False)
    local = local_plan(plan)
    # its one process a watched child of the launcher, not under torch's agent (whose import of torch would delay it)
    assert (local.mode, local.in_this_process, local.num_processes, local.elastic, local.live) == ("single", False, 1,
                                                                                                   False, False)
    assert local.main_process_port is None  # (no local group to meet at: the lighthouse's port is the run's only one)
    assert local.spec.live == {"lighthouse": "http://127.0.0.1:29500", "replica": 1, "min_replicas": 1,
                               "address": "127.0.0.1"}  # (one host: the other machines reach this one on loopback)
    assert local.spec.elastic == {"min_processes": 1, "max_processes": 2, "processes_per_machine": 1}
    assert local.spec.live_settings().replica == 1
    assert "lighthouse at http://127.0.0.1:29500" in plan.describe()
    # a worker that dies here may be restarted (it then heals from a peer): --max_restarts stays with the machine
    assert local_plan(_live_plan(max_restarts=2).validate(check_port=False)).restarts_by_launcher == 2
    # FSDP2 is run (sharded in each machine's group, replicated across machines); DeepSpeed restarts instead (below)
    from hasten.launch.live import live_problem

    assert live_problem(_live_plan(spec=LaunchSpec(fsdp={"fsdp_version": 2}))) is None
    # two processes a machine: torch's agent starts them as the machine's group, on a local store of their own
    pair = local_plan(_live_plan(num_processes=4).validate(check_port=False))
    assert (pair.mode, pair.num_processes, pair.num_machines, pair.main_process_ip) == ("torchrun", 2, 1, "127.0.0.1")
    assert pair.main_process_port not in (None, 29500) and pair.spec.elastic["processes_per_machine"] == 2


def test_a_live_machine_is_advertised_at_the_address_the_main_machine_reaches_it_at(torchft_present, monkeypatch):
    # its replica group's store and torchft manager: the other machines dial this address (127.0.0.1 made machine 1 of
    # two hosts dial its own loopback)
    import hasten.launch.live as launch_live

    monkeypatch.setattr(launch_live, "local_address_for", lambda address: "10.0.0.2" if address == "10.0.0.1" else None)
    monkeypatch.setattr(launch_live, "interface_for_address", lambda address: "eth0")
    remote = launch_live.local_plan(_live_plan(main_process_ip="10.0.0.1").validate(check_port=False))
    assert remote.spec.live["address"] == "10.0.0.2" and remote.spec.live_settings().address == "10.0.0.2"


def test_a_fixed_machine_count_is_refused_at_launch_naming_the_flag(torchft_present):
    from hasten.core.errors import LaunchError

    with pytest.raises(LaunchError, match="--elastic_recovery live") as refused:
        _live_plan(min_machines=None, num_machines=2).validate(check_port=False)
    assert "--num_machines MIN:MAX" in str(refused.value) and str(refused.value).count(". ") == 0  # one sentence


def test_deepspeed_under_live_recovery_restarts_from_the_newest_checkpoint_and_says_so_once(monkeypatch, capsys):
    # ZeRO's partitions are on one machine only: nothing live could heal them, so the run takes the restart path
    # (no lighthouse, torch's elastic agent) after one line; torchft is not needed for it
    import hasten.launch.live as launch_live

    monkeypatch.setattr(launch_live, "find_spec", lambda name: None)
    plan = _live_plan(machine_rank=0, spec=LaunchSpec(deepspeed={"zero_stage": 2})).validate(check_port=False)
    shown = plan.describe()
    assert shown.startswith("# hasten launch: --elastic_recovery live: DeepSpeed ZeRO") and "lighthouse" not in shown
    assert "torch.distributed.run" in shown and "--nnodes=1:2" in shown  # the restart path's elastic agent
    launched = []
    assert launch_live.run_live(plan, lambda local: launched.append(local) or "outcome") == "outcome"
    (restart,) = launched
    assert restart.live is False and restart.spec.live is None and restart.elastic and restart.num_machines == 2
    err = capsys.readouterr().err
    assert err.count("hasten launch:") == 1 and "recovers by starting again from the newest checkpoint" in err
    assert launch_live.checkpoint_fallback(_live_plan()) is None  # DDP and FSDP2 recover live


def test_a_deepspeed_plugin_the_script_makes_is_refused_in_a_live_worker():
    # the launcher could not see it (no --use_deepspeed): the step's reducer would average gradients ZeRO keeps in its
    # partitions, so Accelerator() refuses in one sentence instead of training wrong numbers
    from types import SimpleNamespace

    from hasten.facade.live import start_live
    from hasten.process.elastic import ElasticSizes
    from hasten.utils.dataclasses import DistributedType

    owner = SimpleNamespace(state=SimpleNamespace(distributed_type=DistributedType.DEEPSPEED, num_processes=1))
    run = SimpleNamespace(sizes=ElasticSizes(1, 2, 1))
    with pytest.raises(ValueError, match="cannot run DeepSpeed ZeRO") as refused:
        start_live(owner, run, settings=None)
    assert "--use_deepspeed" in str(refused.value) and str(refused.value).count(". ") == 0


def test_a_live_launch_without_torchft_is_refused(monkeypatch):
    import hasten.launch.live as launch_live
    from hasten.core.errors import LaunchError

    monkeypatch.setattr(launch_live, "find_spec", lambda name: None)
    with pytest.raises(LaunchError, match="needs torchft"):
        _live_plan().validate(check_port=False)


def test_the_flag_reaches_the_plan():
    from hasten.cli.launch import build_plan, launch_parser, resolve_config

    argv = ["--cpu", "--num_machines", "1:2", "--num_processes", "2", "--main_process_ip", "127.0.0.1",
            "--machine_rank", "1", "--elastic_recovery", "live", __file__]
    args = launch_parser().parse_args(argv)
    try:
        plan = build_plan(args, resolve_config(args))
    except Exception as error:  # noqa: BLE001 - without torchft the launch is refused, by this flag
        assert "torchft" in str(error)
        return
    assert plan.live and plan.elastic
    args = launch_parser().parse_args(argv[:-3] + [__file__])
    assert args.elastic_recovery == "restart" and not build_plan(args, resolve_config(args)).live


def test_the_manager_listens_on_the_machines_address_only_and_says_it_there(monkeypatch):
    # torchft 0.2 binds its manager to [::] (every interface); hasten binds it where the other machines reach this one
    manager_module = pytest.importorskip("torchft.manager")

    from hasten.process.live.membership import _listen_on

    seen = []
    monkeypatch.setattr(manager_module, "ManagerServer", lambda *args, bind, **kwargs: seen.append(bind))
    monkeypatch.setattr(manager_module, "_hasten_server", None, raising=False)  # (undone after the test)
    _listen_on("127.0.0.1")
    manager_module.ManagerServer(replica_id="x", bind="[::]:0")
    assert seen == ["127.0.0.1:0"]
