"""A launch plan: what `hasten launch` will start, as a plain value.

`LaunchPlan` turns validated settings into the torchrun argument list and
the environment of the workers, without starting anything, so both are
testable (and printable) on their own.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, field
from typing import Mapping

from ..launch_spec import LaunchSpec

__all__ = ["LaunchPlan", "LaunchError", "find_free_port", "port_in_use"]

WORKER_MODULE = "hasten.launch.worker"


class LaunchError(ValueError):
    """A launch request that cannot work; the message says what to change."""


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True if binding `host:port` fails (something already listens there)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start the processes of one run.

    Example:
        >>> plan = LaunchPlan(target="train.py", num_processes=2, main_process_port=29600)
        >>> plan.torchrun_argv()[:2]
        ['--nnodes=1', '--nproc-per-node=2']
    """

    target: str
    target_args: tuple[str, ...] = ()
    module: bool = False
    num_processes: int = 1
    main_process_ip: str = "127.0.0.1"
    main_process_port: int | None = None
    spec: LaunchSpec = field(default_factory=LaunchSpec)

    @property
    def multi_process(self) -> bool:
        return self.num_processes > 1

    def validate(self, check_port: bool = True) -> "LaunchPlan":
        """Refuse a plan that cannot work, before anything starts; returns the plan with a port chosen."""
        if self.num_processes < 1:
            raise LaunchError(f"--num_processes must be at least 1, got {self.num_processes}.")
        if not self.module and not os.path.isfile(self.target):
            raise LaunchError(f"the script {self.target!r} does not exist; check the path (or use -m for a module).")
        port = self.main_process_port
        if port is not None and not 0 < port < 65536:
            raise LaunchError(f"--main_process_port must be between 1 and 65535, got {port}.")
        if not self.multi_process:
            return self
        if port is None:
            return _replace(self, main_process_port=find_free_port(self.main_process_ip))
        if check_port and port_in_use(port, self.main_process_ip):
            raise LaunchError(
                f"port {port} on {self.main_process_ip} is already in use; pass another --main_process_port "
                "or leave it out to pick a free one."
            )
        return self

    def torchrun_argv(self) -> list[str]:
        """Arguments for torch.distributed.run (torchrun)."""
        argv = [
            "--nnodes=1",
            f"--nproc-per-node={self.num_processes}",
            "--node-rank=0",
            f"--master-addr={self.main_process_ip}",
            f"--master-port={self.main_process_port}",
            "--max-restarts=0",
            "-m",
            WORKER_MODULE,
        ]
        return argv + self.worker_argv()

    def worker_argv(self) -> list[str]:
        """Arguments for hasten.launch.worker: the user's target and its own arguments."""
        return (["--module"] if self.module else []) + [self.target, *self.target_args]

    def worker_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment the workers start with: the caller's plus the launch spec and thread count."""
        env = dict(os.environ if base is None else base)
        env.update(self.spec.to_env())
        if "OMP_NUM_THREADS" not in env:
            # cores / local processes: more threads than cores makes every rank slower
            env["OMP_NUM_THREADS"] = str(max(1, available_cpus() // self.num_processes))
        return env

    def describe(self) -> str:
        """The exact command this plan runs, for --dry_run and logs."""
        if self.multi_process:
            command = [sys.executable, "-m", "torch.distributed.run", *self.torchrun_argv()]
        else:
            command = [sys.executable, "-m", WORKER_MODULE, *self.worker_argv()]
        spec = self.spec.to_env()
        return " ".join(f"{k}='{v}'" for k, v in spec.items()) + " " + " ".join(command)


def _replace(plan: LaunchPlan, **changes: object) -> LaunchPlan:
    from dataclasses import replace

    return replace(plan, **changes)
