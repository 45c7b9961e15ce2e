"""Preemption and progress: what happens at the training loader's batch boundaries.

A *batch boundary* is the moment the training loop asks the prepared
training DataLoader for its next batch (the loader whose batches reached
`backward`). Everything the loop did for the previous batch is done then, so
a checkpoint taken there resumes exactly.

- **Preemption** (on when automatic checkpoint naming is): SIGTERM or
  SIGUSR1, sent to the launcher or to any process, sets a flag. The
  processes agree at the same boundary — every ~1 s of training they
  all-reduce the flag on a side gloo group, at a boundary count all of them
  reach; between checks a boundary costs one integer comparison — then
  save a checkpoint, write one record for the launcher, and exit with
  `EXIT_PREEMPTED`. A signal that arrives before the first training batch
  ends the process as it would have without hasten.
- **Progress** (when `hasten launch` asks for it): the main process touches
  a file after its first training batch, so the launcher knows a failed
  attempt got somewhere and restarting it is worthwhile.
- **Optimizer steps and periodic checkpoints** (when asked for: an elastic
  run, or `ProjectConfiguration(save_every_n_steps=...)`): a boundary after
  a batch whose step synchronised counts one optimizer step; a periodic
  save (`periodic.py`) happens at such a boundary, so it holds no partial
  gradients.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .periodic import PeriodicSaves
from ..process.launch_spec import EXIT_PREEMPTED, PREEMPTION_RECORD_ENV as RECORD_ENV, PROGRESS_FILE_ENV as PROGRESS_ENV

if TYPE_CHECKING:
    from ..data import PreparedDataLoader
    from ..runtime.gradient_state import GradientState
    from .saveset import ProcessFacts

__all__ = ["EXIT_PREEMPTED", "Preempted", "BoundaryWatch", "announce", "RECORD_ENV", "PROGRESS_ENV",
           "PREEMPTION_SIGNALS"]

PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_CHECK_EVERY_SECONDS = 1.0


class Preempted(SystemExit):
    """Raised from the training loop once the preemption checkpoint is saved; exits with `EXIT_PREEMPTED`.

    Example:
        >>> Preempted("ckpt", "SIGTERM", epoch=1, batch=7).code
        75
    """

    def __init__(self, checkpoint: str, signal_name: str, epoch: int, batch: int) -> None:
        super().__init__(EXIT_PREEMPTED)
        self.checkpoint, self.signal_name, self.epoch, self.batch = checkpoint, signal_name, epoch, batch

    def describe(self) -> str:
        return (f"preempted by {self.signal_name} after epoch {self.epoch} batch {self.batch}; "
                f"checkpoint saved to {self.checkpoint}; start the run again to resume from it")


class BoundaryWatch:
    """The `GradientState.boundary_hook`: progress report and preemption agreement (see module doc).

    `save` writes the preemption checkpoint (every process calls it at the
    same boundary) and returns its path; `install` hooks the watch into the
    gradient state when it has something to do.

    Example:
        >>> from hasten.checkpointing.saveset import ProcessFacts
        >>> watch = BoundaryWatch(save=lambda: "ckpt", process=ProcessFacts.alone(), preemption=False,
        ...                       progress_file=None)
        >>> watch.active
        False
    """

    def __init__(self, save: Callable[[], str], process: "ProcessFacts", preemption: bool, progress_file: str | None,
                 periodic: PeriodicSaves | None = None, save_periodic: Callable[[], Any] | None = None,
                 count_steps: bool = False, step_boundaries: bool = False) -> None:
        self.save = save
        self.periodic, self.save_periodic = periodic, save_periodic
        # an elastic run: the processes agree (and save on a signal) only right after an optimizer step, the one
        # boundary every process reaches as often whatever share of a step it takes
        self.step_boundaries = step_boundaries
        self.counting = count_steps or periodic is not None or step_boundaries
        self.optimizer_steps = 0  # counted while `counting`; a checkpoint restores it (`restore_steps`)
        self._handed = 0  # the training loader's `handed_out` at the last boundary
        self.num_processes = process.world
        self.is_main = process.is_main
        self.progress_file = progress_file if process.is_main else None
        self._hooked: GradientState | None = None
        self.preemption = preemption and threading.current_thread() is threading.main_thread()
        self.requested: int | None = None  # the signal received on this process
        self.armed = False  # a training batch was handed out: a signal now means "checkpoint"
        self.boundaries = 0
        self._next_check, self._interval, self._last_check = 1, 1, time.monotonic()
        self._group: Any = None
        self._previous: dict[int, Any] = {}
        if self.preemption:
            if self.num_processes > 1:
                import torch.distributed as dist

                self._group = dist.new_group(backend="gloo")  # collective: every process builds its Accelerator
            for sig in PREEMPTION_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._on_signal)

    @property
    def active(self) -> bool:
        return self.preemption or self.progress_file is not None or self.counting

    def install(self, gradient_state: "GradientState") -> None:
        """Be `gradient_state`'s boundary hook while there is something to do (else leave the hot path empty)."""
        gradient_state.boundary_hook = self if self.active else None
        self._hooked = gradient_state

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if not self.armed:  # nothing to save yet: do what the signal did before hasten
            signal.signal(signum, self._previous.get(signum) or signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.requested = signum

    def close(self) -> None:
        """Give the signals back to their previous handlers."""
        if self.preemption and threading.current_thread() is threading.main_thread():
            for sig, handler in self._previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self.preemption = False

    # -- the hook, at every boundary of a training loader ------------------------------------
    def __call__(self, loader: "PreparedDataLoader") -> None:
        if loader.cursor.yielded:
            self.armed = True
            if self.progress_file is not None:
                Path(self.progress_file).touch()
                self.progress_file = None
        stepped = False
        if self.counting and loader.cursor.handed_out != self._handed:  # a batch was trained on since the last one
            self._handed = loader.cursor.handed_out
            if self._hooked is not None and self._hooked.sync_gradients:
                stepped = True
                self.optimizer_steps += 1
                periodic = self.periodic
                if periodic is not None and periodic.due(self.optimizer_steps, time.monotonic(),
                                                         alone=self.num_processes == 1 or not self.preemption):
                    self._save_periodically(periodic)
        if self.step_boundaries and not stepped:
            return
        self.boundaries += 1
        if self.preemption:
            if self.num_processes == 1:
                if self.requested is not None:
                    self._preempt(loader, self.requested)
            elif self.boundaries >= self._next_check:
                self._check(loader)
        elif self.progress_file is None and not self.counting and self._hooked is not None:
            self._hooked.boundary_hook = None  # nothing left to do: free the hot path

    def _save_periodically(self, periodic: PeriodicSaves) -> None:
        if self.save_periodic is not None:
            self.save_periodic()
        periodic.saved(time.monotonic())

    def restore_steps(self, optimizer_steps: int) -> None:
        """A checkpoint was loaded: the optimizer steps counted so far are the checkpoint's.

        Example:
            >>> from hasten.checkpointing.saveset import ProcessFacts
            >>> watch = BoundaryWatch(save=lambda: "c", process=ProcessFacts.alone(), preemption=False,
            ...                       progress_file=None, count_steps=True)
            >>> watch.restore_steps(7); watch.optimizer_steps
            7
        """
        self.optimizer_steps = int(optimizer_steps)

    def _check(self, loader: "PreparedDataLoader") -> None:
        import torch
        import torch.distributed as dist

        now = time.monotonic()
        elapsed = now - self._last_check
        save_due = self.periodic is not None and self.periodic.elapsed(now)
        values = torch.tensor([float(self.requested or 0), elapsed, float(save_due)], dtype=torch.float64)
        dist.all_reduce(values, op=dist.ReduceOp.MAX, group=self._group)
        if values[0] > 0:
            self._preempt(loader, int(values[0]))
        if values[2] > 0 and self.periodic is not None:  # one clock said so: all save after the next optimizer step
            self.periodic.agreed = True
        # Same inputs on every process => the same next check on every process.
        scale = _CHECK_EVERY_SECONDS / max(float(values[1]), 1e-4)
        self._interval = max(1, min(100_000, int(self._interval * scale)))
        self._next_check = self.boundaries + self._interval
        self._last_check = time.monotonic()

    def _preempt(self, loader: "PreparedDataLoader", signum: int) -> None:
        self.close()
        path = self.save()
        stop = Preempted(str(path), signal.Signals(signum).name, loader.cursor.epoch, loader.cursor.yielded)
        if self.is_main:
            announce(stop, str(path))
        raise stop


def announce(stop: Preempted, checkpoint: str = "", say: Callable[[str], Any] | None = None) -> None:
    """Tell of a stop: the record the launcher reads and prints (when launched), else one line through `say`
    (standard error by default).

    Example:
        >>> announce(Preempted("ckpt", "SIGTERM", epoch=0, batch=3), "ckpt", say=print)  # doctest: +NORMALIZE_WHITESPACE
        hasten: preempted by SIGTERM after epoch 0 batch 3; checkpoint saved to ckpt;
        start the run again to resume from it.
    """
    record = os.environ.get(RECORD_ENV)
    if record:
        Path(record).write_text(json.dumps({"message": stop.describe(), "checkpoint": checkpoint}))
    elif say is not None:
        say(f"hasten: {stop.describe()}.")
    else:
        sys.stderr.write(f"hasten: {stop.describe()}.\n")


def read_preemption_record(path: str | os.PathLike[str]) -> str | None:
    """The line a launcher prints for a preempted run (None when the run was not preempted)."""
    try:
        return json.loads(Path(path).read_text())["message"]
    except (OSError, ValueError, KeyError):
        return None
