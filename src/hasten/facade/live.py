"""The worker's side of live recovery (phase 1: DDP, one process per machine): the step rule over torchft's quorums.

When the launch spec has a ``live`` field (`hasten.process.launch_spec.LiveSettings`), `Accelerator()` attaches a
`LiveStep` to its `ElasticRun`, and the user's unchanged loop trains like this:

- the prepared loader asks `begin_step()` before each step's first micro-batch: the quorum gives P and this
  process's rank, so `ElasticRun.layout` deals the step's M micro-batches over the machines there are now;
- `accelerator.backward` at the step's synchronising micro-batch averages the gradients over the quorum
  (`LiveReducer`: no torch DDP across machines; a failure is recorded, not raised);
- the prepared optimizer's `step()` steps only if `commit()` is True; otherwise the gradients are zeroed, the
  scheduler does not step, ``sync_gradients`` is False, the models' buffers go back to the step's start
  (`StepBuffers`: BatchNorm statistics are not updated twice), and the loader deals the *same* step again at the new
  P before it yields anything else: every sample of a committed step is trained once, no optimizer step twice;
- a machine that joins receives the models, optimizers, schedulers, gradient scaler, registered objects
  (`register_for_checkpointing`), step count and loader position from a live peer inside the script's
  `load_state()` (`join_now`: before the script reads where the run is), else inside its first `begin_step()`;
- SIGTERM or SIGUSR1 (a spot notice, a drained node, a stopped launcher) is a graceful leave: the step in progress
  finishes with everyone, and at the next step boundary this machine leaves the group instead of asking for a quorum
  (`LeftLiveRun`, exit code `EXIT_PREEMPTED`); the others' next quorum is formed without it once its heartbeat
  stops, with no step attempt failed and nothing saved (they hold the state).

Example:
    >>> from hasten.process.elastic import ElasticSizes
    >>> from hasten.facade.elastic import ElasticRun
    >>> class Fake:                                    # a group whose step 0 fails once (see tests/test_live_units.py)
    ...     def __init__(self): self.calls = 0
    ...     def register_state(self, save, load): pass
    ...     def begin_step(self):
    ...         from hasten.process.live import LiveQuorum
    ...         return LiveQuorum(step=0, replicas=1, replica_rank=0, quorum_id=self.calls)
    ...     def commit(self): self.calls += 1; return self.calls > 1
    >>> run = ElasticRun(ElasticSizes(1, 2, 1), accumulation=1, world=1)
    >>> live = LiveStep(run, Fake()); _ = live.begin_step()
    >>> live.commit(), live.redo, run.layout.own()
    (False, True, 2)
"""

from __future__ import annotations

import os
import signal
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable

from ..checkpointing.preemption import PREEMPTION_SIGNALS, Preempted, announce
from ..process.launch_spec import MACHINE_ENV
from ..process.live import LiveQuorum, LiveReducer, live_line

if TYPE_CHECKING:
    from .elastic import ElasticRun

__all__ = ["LiveStep", "LeftLiveRun", "StepBuffers", "start_live"]


class LeftLiveRun(Preempted):
    """Raised at a step boundary of a live run after SIGTERM/SIGUSR1: this machine left, the others go on in memory.

    It ends the process like a preemption (quiet, exit code `EXIT_PREEMPTED`), but no checkpoint is needed: the
    machines left hold the state, and a machine that starts its command again heals from them.

    With automatic checkpoint naming, the first machine of the last quorum also saves its state on the way out (the
    others do not wait for it): when every machine is stopped at once (a cancelled job), the run resumes from there
    with no step redone.

    Example:
        >>> stop = LeftLiveRun("SIGTERM", optimizer_steps=12, machine="vm/1")
        >>> stop.code, stop.describe()
        (75, 'vm/1 left the live run on SIGTERM after optimizer step 12; the other machines go on without a restart; start this command again to rejoin from a live peer')
    """

    def __init__(self, signal_name: str, optimizer_steps: int, machine: str, checkpoint: str = "") -> None:
        super().__init__(checkpoint, signal_name, epoch=0, batch=0)
        self.optimizer_steps, self.machine = optimizer_steps, machine

    def describe(self) -> str:
        saved = f"; its state is saved to {self.checkpoint}, for a restart of every machine" if self.checkpoint else ""
        return (f"{self.machine} left the live run on {self.signal_name} after optimizer step {self.optimizer_steps}; "
                f"the other machines go on without a restart; start this command again to rejoin from a live peer"
                f"{saved}")


class LiveStep:
    """One machine's live run: quorum per step, one all-reduce, commit-or-redo, and what a joiner receives.

    `group` is a `hasten.process.live.LiveGroup` (or a stand-in with `begin_step`, `allreduce`, `commit`,
    `register_state`); `owner` the Accelerator whose prepared objects are sent to joiners. See the module doc.
    """

    def __init__(self, run: ElasticRun, group: Any, owner: Any = None, say: Callable[[str], None] | None = None,
                 local_rank: int = 0) -> None:
        self.run = run
        self.local_rank = local_rank  # this process in its machine (each machine runs processes_per_machine)
        self.group = group
        self._owner = weakref.ref(owner) if owner is not None else (lambda: None)
        self.say = say if say is not None else (lambda line: print(line, flush=True))
        self.quorum: LiveQuorum | None = None
        self.redo = False  # the last step did not commit: the loader deals it again before anything else
        self.attempts_failed = 0  # step attempts that did not commit (each dealt again)
        self._decided: bool | None = None  # this step's commit decision (asked once per step, whatever the optimizers)
        self._failed_since: float | None = None
        self._redone = 0
        self._reducer: LiveReducer | None = None
        self.loaders: list[Any] = []  # the prepared loaders that deal live steps (their positions go to joiners)
        self.leaving: int | None = None  # SIGTERM/SIGUSR1 received: leave at the next step boundary
        self._previous: dict[int, Any] = {}
        self._buffers: StepBuffers | None = None  # the models' buffers at the step's start (put back on a redo)
        self._early: LiveQuorum | None = None  # the first step's quorum, taken at load_state (`join_now`)
        group.register_state(self.save, self.load)

    # -- a graceful leave ------------------------------------------------------------------------
    def watch_signals(self) -> None:
        """SIGTERM / SIGUSR1 mean "leave at the next step boundary" (main thread only: Python's rule for handlers)."""
        if threading.current_thread() is threading.main_thread():
            for sig in PREEMPTION_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.quorum is None:  # not in the group yet: nobody waits for this machine, stop as without hasten
            self.release_signals()
            os.kill(os.getpid(), signum)
            return
        self.leaving = signum

    def release_signals(self) -> None:
        """Give SIGTERM / SIGUSR1 back to their previous handlers."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    def _agreed_leave(self) -> int:
        """The signal this machine leaves on at this boundary (0: it stays): with several processes, all of them
        leave if any got one (one small all-reduce over the machine's group: else one would ask for a quorum its
        machine's others never join)."""
        mine = int(self.leaving or 0)
        if (self.run.sizes.processes_per_machine or 1) == 1:
            return mine
        import torch
        import torch.distributed as dist

        flag = torch.tensor([mine], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())

    def _leave(self, signum: int) -> None:
        steps = self.optimizer_steps()
        self.release_signals()
        self.group.close()  # its heartbeat stops: the next quorum forms without it
        checkpoint = self._save_on_leave()  # (after leaving: nobody waits for it)
        stop = LeftLiveRun(signal.Signals(signum).name, steps, os.environ.get(MACHINE_ENV, "this machine"), checkpoint)
        if self.local_rank == 0:  # (launched: the launcher says the line and exits with EXIT_PREEMPTED)
            announce(stop, checkpoint, say=self.say)
        raise stop

    def _save_on_leave(self) -> str:
        """The leave's checkpoint (automatic naming; the last quorum's first machine only), its path or ""."""
        owner = self._owner()
        if owner is None or not owner.project_configuration.automatic_checkpoint_naming:
            return ""
        return str(self.first_machine_only(owner._boundary_watch.save)() or "")

    # -- the step --------------------------------------------------------------------------------
    def join_now(self) -> None:
        """At the script's `load_state()`, before its first step: take the first step's quorum now, so that a joiner
        holds its live peer's state (the loader's epoch, the step count, registered objects) when `load_state`
        returns, before the script reads where the run is (an epoch loop that starts at the loader's epoch would
        otherwise run the epochs left from the joiner's checkpoint, not the peer's). The loader's first step uses it."""
        if self.quorum is None and self._early is None:
            self._early = self.begin_step()

    def begin_step(self) -> LiveQuorum:
        """The loader's step boundary: this step's quorum sets the group size and rank (a joiner is healed inside)."""
        if self._early is not None:  # (taken at load_state: this is that step)
            quorum, self._early = self._early, None
            return quorum
        leaving = self._agreed_leave()
        if leaving:  # (before asking: a member of the quorum that then left would fail its step)
            self._leave(leaving)
        if self.quorum is None:  # the first step: a run resumed from a checkpoint joins at the checkpoint's step
            self.group.resume_step = self.optimizer_steps()
        if self._failed_since is not None and self._buffers is not None:  # the last attempt failed: undo its
            self._buffers.put_back()  # forward passes' buffer updates (before a heal, which brings the peer's own)
        quorum = self.group.begin_step()
        self._step_buffers().keep()
        per_machine = self.run.sizes.processes_per_machine or 1
        self.run.world, self.run.rank = quorum.processes(per_machine), quorum.rank(per_machine, self.local_rank)
        seconds = time.monotonic() - self._failed_since if self._failed_since is not None else None
        line = live_line(self.quorum, quorum, seconds, self._redone)
        if line is not None and (quorum.healed or (self.quorum is not None and quorum.replicas != self.quorum.replicas)):
            if self.local_rank == 0:  # (one line a machine)
                self.say(line)
            self._redone = 0
        self.quorum, self._decided, self._failed_since = quorum, None, None
        return quorum

    def _step_buffers(self) -> StepBuffers:
        if self._buffers is None:
            owner = self._owner()
            models = list(owner._models) if owner is not None else []
            self._buffers = StepBuffers([item for m in models for item in m.named_buffers()])
        return self._buffers

    def optimizer_steps(self) -> int:
        """The run's optimizer steps so far (counted at step boundaries; a checkpoint or a peer restores them)."""
        owner = self._owner()
        return int(owner._boundary_watch.optimizer_steps) if owner is not None else 0

    def first_machine_only(self, save: Callable[[], Any]) -> Callable[[], Any]:
        """`save` (a periodic checkpoint) done by the first machine of the step's quorum only: every machine holds the
        same state, and the machines may share the project folder. The saver numbers its checkpoint past the
        folder's newest, so another machine that takes the role over (the first one lost) never reuses a name."""
        def save_if_first() -> Any:
            if self.quorum is None or self.quorum.replica_rank != 0:
                return None
            self._number_past_newest()
            return save()
        return save_if_first

    def save_state_once(self, save: Callable[[], str], output_dir: str | None) -> str:
        """The script's own `save_state()` in a live run: written by the first machine of the step's quorum (machine 0
        before the first step), skipped by the others, as every machine holds the same state and two machines writing
        one folder collide; every machine returns the folder the first one writes."""
        first = self.quorum.replica_rank == 0 if self.quorum is not None else \
            int(getattr(self.group, "replica_id", 0) or 0) == 0
        target = self._number_past_newest()
        if first:
            return save()
        if output_dir is not None:
            return output_dir
        return target or ""

    def _number_past_newest(self) -> str | None:
        """With automatic naming, the next checkpoint is numbered past the project folder's newest (the machines may
        share it); returns that checkpoint's folder (None without automatic naming)."""
        owner = self._owner()
        if owner is None or not owner.project_configuration.automatic_checkpoint_naming:
            return None
        from ..checkpointing.project import checkpoints_root, list_checkpoints

        config = owner.project_configuration
        root = checkpoints_root(config)
        found = list_checkpoints(root, complete_only=False)
        if found:
            config.iteration = max(config.iteration, found[-1][0] + 1)
        return os.path.join(root, f"checkpoint_{config.iteration}")

    def reduce(self) -> bool:
        """At the step's synchronising backward: average the gradients of the prepared models over the quorum."""
        if self._reducer is None:
            owner = self._owner()
            models = list(owner._models) if owner is not None else []
            self._reducer = LiveReducer([p for m in models for p in m.parameters()], self.group)
        return self._reducer.reduce()

    def commit(self) -> bool:
        """The prepared optimizer's gate: True steps it; False skips it and marks the step for dealing again."""
        if self._decided is None:
            self._decided = bool(self.group.commit())
            if not self._decided:
                self.redo = True
                self.attempts_failed += 1
                self._redone += 1
                self._failed_since = time.monotonic()
        return self._decided

    # -- what a joiner receives ----------------------------------------------------------------
    def save(self) -> dict[str, Any]:
        """This machine's state at a step boundary: prepared models, optimizers, schedulers, the gradient scaler, the
        objects registered for checkpointing (a script's step counter, an EMA model), step count, loaders."""
        owner = self._owner()
        if owner is None:
            return {}
        return {"models": [owner.strategy.unwrap_model(m).state_dict() for m in owner._models],
                "optimizers": [opt.optimizer.state_dict() for opt in owner._optimizers],
                "schedulers": [s.scheduler.state_dict() for s in owner._schedulers],
                "scaler": owner.scaler.state_dict() if owner.scaler is not None else None,
                "registered": [obj.state_dict() for obj in owner._custom_objects],
                "optimizer_steps": self.optimizer_steps(),
                # by the loader's place among the prepared ones (the same script: the same place on every machine)
                "loaders": {str(index): loader.live_position() for index, loader in enumerate(owner._dataloaders)
                            if any(loader is dealing for dealing in self.loaders)}}

    def load(self, state: dict[str, Any]) -> None:
        """Apply a live peer's state (inside this machine's first quorum): training continues where the peer is."""
        owner = self._owner()
        if owner is None or not state:
            return
        for model, saved in zip(owner._models, state["models"]):
            owner.strategy.unwrap_model(model).load_state_dict(saved)
        for opt, saved in zip(owner._optimizers, state["optimizers"]):
            opt.optimizer.load_state_dict(saved)
        for sched, saved in zip(owner._schedulers, state["schedulers"]):
            sched.scheduler.load_state_dict(saved)
        if owner.scaler is not None and state["scaler"] is not None:
            owner.scaler.load_state_dict(state["scaler"])
        for obj, saved in zip(owner._custom_objects, state["registered"]):
            obj.load_state_dict(saved)
        owner.gradient_state.optimizer_steps = int(state["optimizer_steps"])
        owner._boundary_watch.restore_steps(int(state["optimizer_steps"]))
        for index, saved in state["loaders"].items():
            owner._dataloaders[int(index)].heal_live_position(saved)

    def attach(self, loader: Any) -> None:
        """`loader` deals live steps (called when its first training pass starts)."""
        if all(loader is not known for known in self.loaders):
            self.loaders.append(loader)


class StepBuffers:
    """The models' buffers as of a step's start, put back when the step's attempt failed and is dealt again.

    A failed attempt's forward passes have already moved running statistics (BatchNorm's ``running_mean``,
    ``running_var``, ``num_batches_tracked``); the redone step would move them a second time, and the run would end
    with buffers the uninterrupted run never had. Every buffer is copied at each step's start, into the copies of the
    last step (no new memory): version counters cannot say which changed, as BatchNorm's kernel updates its running
    statistics without counting. Buffers are small beside the gradients a live step all-reduces.

    Example:
        >>> import torch
        >>> norm = torch.nn.BatchNorm1d(2)
        >>> kept = StepBuffers(list(norm.named_buffers())); kept.keep()
        >>> _ = norm(torch.randn(4, 2))              # an attempt that fails
        >>> kept.put_back(); float(norm.running_var.sum()), int(norm.num_batches_tracked)
        (2.0, 0)
    """

    def __init__(self, named: list[tuple[str, Any]]) -> None:
        self._buffers = [buffer for _, buffer in named]
        self._copies: list[Any] = []

    def keep(self) -> None:
        """At a step's start: copy every buffer."""
        import torch

        with torch.no_grad():
            if [(c.shape, c.dtype) for c in self._copies] != [(b.shape, b.dtype) for b in self._buffers]:
                self._copies = [buffer.detach().clone() for buffer in self._buffers]
            elif self._copies:
                torch._foreach_copy_(self._copies, self._buffers)

    def put_back(self) -> None:
        """After a failed attempt: every buffer back to the step's start."""
        import torch

        if self._copies:
            with torch.no_grad():
                torch._foreach_copy_(self._buffers, self._copies)


def start_live(owner: Any, run: ElasticRun, settings: Any) -> LiveStep:
    """At `Accelerator()` in a live run: the live group (not started before the first step) and the step rule."""
    import atexit

    from ..process.live import LiveGroup

    per_machine = run.sizes.processes_per_machine or 1
    if owner.state.distributed_type == "DEEPSPEED":  # (DistributedType is a str enum)
        # (a plugin the script made itself: the launcher could not see it and restart instead; the step's reducer
        # would average gradients ZeRO keeps in its partitions, a silently wrong run)
        raise ValueError("live recovery (--elastic_recovery live) cannot run DeepSpeed ZeRO, whose partitions are held "
                         "on one machine only; pass --use_deepspeed to hasten launch (it then recovers from the newest "
                         "checkpoint) or launch with --elastic_recovery restart.")
    if owner.state.num_processes != per_machine:
        raise ValueError(f"live recovery runs each machine's {per_machine} process(es) as its own group, but this group "
                         f"has {owner.state.num_processes}; launch with hasten launch --elastic_recovery live.")
    group = LiveGroup(settings.lighthouse, replica=settings.replica, min_replicas=settings.min_replicas,
                      address=settings.address,
                      timeout=owner.state.timeout if getattr(owner.state, "timeout", None) else _default_timeout(),
                      rank=owner.state.local_process_index, world_size=per_machine)
    if per_machine > 1:  # the machine's processes meet at a store its local rank 0 hosts (a collective of the machine)
        import torch
        import torch.distributed as dist

        port = torch.tensor([group.host_store() if owner.state.local_process_index == 0 else 0], dtype=torch.int64)
        dist.broadcast(port, src=0)
        group.store_port = int(port.item())
    live = LiveStep(run, group, owner, say=lambda line: print(line, flush=True),
                    local_rank=owner.state.local_process_index)
    run.live = live
    watch = owner._boundary_watch
    if watch.save_periodic is not None:  # periodic checkpoints, for losing every machine at once
        watch.save_periodic = live.first_machine_only(watch.save_periodic)
    live.watch_signals()
    atexit.register(group.close)
    return live


def _default_timeout() -> Any:
    from datetime import timedelta

    return timedelta(seconds=30)
