"""A launch plan: what `hasten launch` or `notebook_launcher` will start, as a plain value.

`LaunchPlan` turns validated settings into the command line (torchrun's
arguments, or mpirun's) and the environment of the workers, without
starting anything, so both are testable and printable (`--dry_run`).
`launch.run` carries out any plan; a plan from `notebook_launcher` differs
only in what each process runs (its `function`, in forked processes,
instead of the target script).
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from .config import DEFAULT_LIVENESS_TIMEOUT, ConfigError, check_layout
from ..core.errors import LaunchError
from ..process.launch_spec import AS_ACCELERATE_ENV, HEARTBEAT_DIR_ENV, MACHINE_ENV, LaunchSpec
from .elastic import elastic_spec, elastic_torchrun_argv
from .live import describe_live, live_problem
from .network import interface_for_address, is_loopback

__all__ = ["LaunchPlan", "LaunchError", "find_free_port", "port_in_use", "available_cpus"]

WORKER_MODULE = "hasten.launch.worker"
DEFAULT_MULTI_NODE_PORT = 29500


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
        except OSError as error:
            # An address that is not ours cannot be checked from here.
            return error.errno != 99  # EADDRNOTAVAIL
    return False


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start the processes of one run (on this machine).

    `num_processes` is the total across machines.

    Example:
        >>> plan = LaunchPlan(target="train.py", num_processes=2, main_process_port=29600)
        >>> plan.torchrun_argv()[:2]
        ['--nnodes=1', '--nproc-per-node=2']
    """

    target: str
    target_args: tuple[str, ...] = ()
    module: bool = False
    num_processes: int = 1
    num_machines: int = 1  # with `min_machines`: the most machines of an elastic run (num_processes is at that size)
    min_machines: int | None = None  # `--num_machines MIN:MAX`: an elastic run (None: a fixed group of num_machines)
    machine_rank: int = 0
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str = "static"
    max_restarts: int = 0
    monitor_interval: float = 0.1
    liveness_timeout: float = DEFAULT_LIVENESS_TIMEOUT  # seconds without a sign of life: frozen (launch/liveness.py)
    mpirun: bool = False
    mpirun_hostfile: str | None = None
    gpu_ids: str = "all"
    network_interface: str | None = None
    quiet: bool = False
    spec: LaunchSpec = field(default_factory=LaunchSpec)
    # variables every worker gets over the caller's (Accelerate's launcher sets OMP_NUM_THREADS, KMP_* ...)
    extra_env: Mapping[str, str] = field(default_factory=dict)
    # one process: run it in this process (`hasten launch`), or as a child process (`accelerate launch`'s way)
    in_this_process: bool = True
    # Accelerate's multi-GPU launcher (`--multi_gpu`, FSDP): torch's elastic agent even for one process
    through_torchrun: bool = False
    # notebook_launcher: each process runs function(*function_args) (forked) instead of the target
    function: Callable[..., Any] | None = None
    function_args: tuple[Any, ...] = ()
    # torchelastic's settings that only notebook_launcher exposes (None: torchrun's defaults)
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    rdzv_conf: Mapping[str, Any] | None = None  # also `hasten launch --rdzv_conf`
    log_line_prefix_template: str | None = None
    # torchrun's options the launch command passes on (`--tee`, `--log_dir`, `--role`, `--no_python`)
    tee: str = "0"
    log_dir: str | None = None  # each attempt's per-rank logs and error files are kept in a folder under it
    role: str = "default"
    no_python: bool = False  # run the target as an executable, without hasten's worker around it
    # `--elastic_recovery live`: survivors keep training in memory (launch/live.py: a lighthouse, local launches)
    live: bool = False

    # -- derived ------------------------------------------------------------------
    @property
    def processes_per_machine(self) -> int:
        return self.num_processes // self.num_machines

    @property
    def mode(self) -> str:
        """'mpirun', 'torchrun' (several processes or machines) or 'single' (run in this process)."""
        if self.mpirun:
            return "mpirun"
        if self.num_processes > 1 or self.num_machines > 1 or self.max_restarts > 0 or self.elastic:
            return "torchrun"
        if self.through_torchrun and self.function is None:
            return "torchrun"
        if self.function is None and (self.torchrun_options() or self.log_dir):  # only torchrun does these
            return "torchrun"
        return "single"

    def torchrun_options(self) -> list[str]:
        """torchrun's arguments for `--tee`, `--log_dir`'s logs, `--role` and `--rdzv_conf`, where given.

        Example:
            >>> LaunchPlan(target="train.py", tee="3", role="trainer").torchrun_options()
            ['--tee=3', '--role=trainer']
        """
        argv = [f"--tee={self.tee}"] if str(self.tee) != "0" else []
        argv += [f"--role={self.role}"] if self.role != "default" else []
        if self.rdzv_conf and not self.elastic:  # an elastic plan renders its own
            argv.append("--rdzv-conf=" + ",".join(f"{key}={value}" for key, value in self.rdzv_conf.items()))
        return argv

    @property
    def elastic(self) -> bool:
        """True for `--num_machines MIN:MAX`: torch's agents re-form the group with any number of machines in range."""
        return self.min_machines is not None

    @property
    def restarts_by_launcher(self) -> int:
        """Restarts `hasten launch` does itself: on one machine it restarts only after an attempt that made progress.

        On several machines torchrun's agents restart together (they
        coordinate through the rendezvous), with no progress check; so do
        they for `notebook_launcher`, as in the peer.
        """
        return self.max_restarts if self.num_machines == 1 and self.function is None and not self.elastic else 0

    @property
    def multi_process(self) -> bool:
        return self.mode != "single"

    @property
    def master_addr(self) -> str:
        return self.main_process_ip or "127.0.0.1"

    # -- validation -------------------------------------------------------------------
    def validate(self, check_port: bool = True, check_script: bool = True) -> "LaunchPlan":
        """Refuse a plan that cannot work, before anything starts; returns the plan with a port chosen.

        `check_script=False` lets a missing script fail in the process that runs it (`accelerate launch`'s way:
        the child's error then goes with the launcher's).
        """
        try:
            check_layout(self.num_processes, self.num_machines, self.machine_rank, self.main_process_ip,
                         self.main_process_port)
        except ConfigError as error:
            raise LaunchError(str(error)) from None
        if (check_script and not self.module and not os.path.isfile(self.target)
                and not (self.no_python and shutil.which(self.target))):
            raise LaunchError(f"the script {self.target!r} does not exist; check the path (or use -m for a module).")
        if self.mpirun and shutil.which("mpirun") is None:
            raise LaunchError("--mpirun needs Open MPI's mpirun on PATH; install it (apt-get install openmpi-bin).")
        if self.mpirun and self.mpirun_hostfile and not os.path.isfile(self.mpirun_hostfile):
            raise LaunchError(f"the mpirun hostfile {self.mpirun_hostfile!r} does not exist.")
        if self.gpu_ids != "all" and not all(part.strip().isdigit() for part in self.gpu_ids.split(",")):
            raise LaunchError(f"--gpu_ids {self.gpu_ids!r} must be 'all' or GPU numbers like 0,1.")
        if self.live and (problem := live_problem(self)):
            raise LaunchError(problem)
        if self.elastic and self.spec.elastic is None:
            return replace(self, spec=replace(self.spec, elastic=elastic_spec(self))).validate(check_port)
        port = self.main_process_port
        if not self.multi_process:
            return self
        if port is None:
            if self.num_machines > 1 or self.elastic:  # every machine must agree on it: no random choice
                return replace(self, main_process_port=DEFAULT_MULTI_NODE_PORT).validate(check_port)
            return replace(self, main_process_port=find_free_port(self.master_addr))
        if check_port and self.machine_rank == 0 and port_in_use(port, self.master_addr):
            raise LaunchError(
                f"port {port} on {self.master_addr} is already in use; pass another --main_process_port "
                "or leave it out to pick a free one."
            )
        return self

    # -- commands -----------------------------------------------------------------------
    def torchrun_argv(self) -> list[str]:
        """Arguments for torch.distributed.run (torchrun)."""
        if self.elastic:
            return elastic_torchrun_argv(self) + self.torchrun_options() + self._program(torchrun=True)
        argv = [f"--nnodes={self.num_machines}", f"--nproc-per-node={self.processes_per_machine}"]
        if self.rdzv_backend == "c10d":
            argv += ["--rdzv-backend=c10d", f"--rdzv-endpoint={self.master_addr}:{self.main_process_port}",
                     "--rdzv-id=hasten"]
        else:
            argv += [f"--node-rank={self.machine_rank}", f"--master-addr={self.master_addr}",
                     f"--master-port={self.main_process_port}"]
        agent_restarts = self.max_restarts - self.restarts_by_launcher
        argv += [f"--max-restarts={agent_restarts}", f"--monitor-interval={self.monitor_interval}"]
        return argv + self.torchrun_options() + self._program(torchrun=True)

    def mpirun_argv(self, is_root: bool | None = None, cpus: int | None = None) -> list[str]:
        """The full mpirun command (Open MPI): each rank runs the worker; gloo connects them."""
        is_root = (os.geteuid() == 0) if is_root is None else is_root
        cpus = available_cpus() if cpus is None else cpus
        argv = ["mpirun", "-np", str(self.num_processes), "--bind-to", "none"]
        if is_root:
            argv.append("--allow-run-as-root")
        if self.mpirun_hostfile:
            argv += ["--hostfile", self.mpirun_hostfile]
        elif self.num_processes > cpus:
            argv.append("--oversubscribe")
        # set by the launch itself; ranks on other hosts could not write into this machine's directory
        heartbeats = (HEARTBEAT_DIR_ENV,) if HEARTBEAT_DIR_ENV in os.environ and not self.mpirun_hostfile else ()
        switch = ("PYTHONPATH", AS_ACCELERATE_ENV) if os.environ.get(AS_ACCELERATE_ENV) == "1" else ()
        for name in ("MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", *self.spec.to_env(), *heartbeats, *switch,
                     *(n for n in self.extra_env if n not in ("MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"))):
            argv += ["-x", name]
        return argv + self._program()

    def _program(self, torchrun: bool = False) -> list[str]:
        """What each process runs: hasten's worker around the target, or with `no_python` the target itself."""
        if self.no_python:
            return (["--no-python"] if torchrun else []) + [self.target, *self.target_args]
        return (["-m"] if torchrun else [sys.executable, "-m"]) + [WORKER_MODULE, *self.worker_argv()]

    def worker_argv(self) -> list[str]:
        """Arguments for hasten.launch.worker: the user's target and its own arguments."""
        return (["--module"] if self.module else []) + [self.target, *self.target_args]

    def worker_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment the workers start with: the caller's, plus the spec, threads, GPUs, network."""
        env = dict(os.environ if base is None else base)
        env.update(self.spec.to_env())
        env.update(self.extra_env)
        if "OMP_NUM_THREADS" not in env:
            # cores / local processes: more threads than cores makes every rank slower
            env["OMP_NUM_THREADS"] = str(max(1, available_cpus() // self.processes_per_machine))
        if self.gpu_ids != "all":
            env["CUDA_VISIBLE_DEVICES"] = self.gpu_ids.replace(" ", "")
        if self.mode == "mpirun":
            env["MASTER_ADDR"] = self.master_addr
            env["MASTER_PORT"] = str(self.main_process_port)
        interface = self.network_interface
        if interface is None and self.num_machines > 1 and not is_loopback(self.master_addr):
            interface = interface_for_address(self.master_addr)
        if interface:
            # gloo otherwise advertises whatever the hostname resolves to (often
            # 127.0.0.1) and the other machines wait for it forever. An explicit
            # --network_interface wins over the environment; a detected one does not.
            assign = env.__setitem__ if self.network_interface else env.setdefault
            assign("GLOO_SOCKET_IFNAME", interface)
            assign("NCCL_SOCKET_IFNAME", interface)
        if self.quiet:
            env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        if self.elastic:  # who left or joined, in the line a re-formation prints
            env[MACHINE_ENV] = f"{socket.gethostname()}/{self.machine_rank}"
            # torch's agents share the rendezvous TCPStore with the workers and keep the bootstrap address of their
            # first round: an agent that was rank 0 before does not publish it in a later round, and a machine that
            # joins waits for it until its timeout (torch 2.13). Unshared, rank 0 publishes it in every round.
            env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        if self.function is not None:
            # torch.cuda.is_available() via NVML: asking the driver would initialise CUDA in the forking process.
            env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
        return env

    def elastic_settings(self) -> dict[str, Any]:
        """What torchelastic's launch config takes from a `notebook_launcher` plan beyond torchrun's arguments.

        Example:
            >>> LaunchPlan(target="train.py").elastic_settings()
            {}
        """
        if self.function is None:
            return {}
        import multiprocessing

        conf = dict(self.rdzv_conf or {})
        if self.rdzv_backend == "static":
            conf.setdefault("rank", self.machine_rank)
        return {
            # fork, where the platform has it: functions from notebook cells cannot be pickled by name
            "start_method": "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn",
            "role": "default_role",
            "rdzv_backend": self.rdzv_backend,
            "run_id": self.rdzv_id or "none",
            "rdzv_endpoint": self.rdzv_endpoint or f"{self.master_addr}:{self.main_process_port}",
            "rdzv_configs": conf,
            "log_line_prefix_template": self.log_line_prefix_template,
        }

    def command(self) -> list[str]:
        """The command this plan runs, as argv."""
        if self.mode == "mpirun":
            return self.mpirun_argv()
        if self.mode == "torchrun":
            return [sys.executable, "-m", "torch.distributed.run", *self.torchrun_argv()]
        return self._program()

    def describe(self) -> str:
        """The exact command and launch spec, for --dry_run and logs."""
        if self.live:
            return describe_live(self)
        env = self.worker_env({})
        shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
        return f"{shown} {shlex.join(self.command())}"
