"""Accelerate's launch helpers (``accelerate.utils.launch``): a filled launch namespace -> command + environment.

Each `prepare_*` function takes a namespace of the launch command's flags
(`launch_command_parser`, after `_validate_launch_command`, or one built by
hand) and returns what Accelerate's returns for it: the command to run,
where that launcher builds one, and the environment — the caller's, plus
the `ACCELERATE_*` / `FSDP_*` / `PARALLELISM_CONFIG_*` variables and the
launcher's own (`OMP_NUM_THREADS`, `CUDA_VISIBLE_DEVICES`, `MASTER_ADDR`
...). The namespace is read by the launch command's one resolution
(`launch_settings.settings_of_namespace`, every value counting as given),
the spec built by its `spec_for`; the variables are derived from the spec by
`LaunchSpec.peer_env`, the one place that writes them, and the spec itself
is in the environment too, so a hasten script started with it runs as
configured.

Example:
    >>> import argparse
    >>> args = argparse.Namespace(num_processes=2, num_machines=1, main_process_ip=None, main_process_port=0,
    ...                           machine_rank=0, module=False, no_python=False, debug=False, gpu_ids="all",
    ...                           mixed_precision="no", dynamo_backend="no", num_cpu_threads_per_process=1)
    >>> env = prepare_multi_gpu_env(args)
    >>> env["ACCELERATE_MIXED_PRECISION"], args.nproc_per_node, args.master_port.isdigit()
    ('no', '2', True)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import warnings
from shutil import which
from typing import Mapping

from ..core.availability import compare_versions, is_fp8_available
from ..options.enums import PrecisionType
from ..process.launch_spec import LaunchSpec, fp8_settings
from ..process.ports import get_free_port, is_port_in_use
from .launch_build import spec_for
from .launch_settings import ResolvedLaunch, settings_of_namespace

__all__ = ["DEEPSPEED_MULTINODE_LAUNCHERS", "TORCH_LAUNCH_PARAMS", "spec_from_args", "launcher_env", "run_deepspeed_itself", "_filter_args", "_get_mpirun_args",
           "setup_fp8_env", "prepare_simple_launcher_cmd_env", "prepare_multi_gpu_env",
           "prepare_extend_env_parallelism_config", "prepare_deepspeed_cmd_env", "prepare_tpu", "env_var_path_add",
           "subprocess", "which"]

# How DeepSpeed reaches the other machines, by Accelerate's names (the first is its default).
DEEPSPEED_MULTINODE_LAUNCHERS = ["pdsh", "standard", "openmpi", "mvapich", "mpich", "nossh", "slurm"]
# The argument names of torch's launcher (``accelerate.utils.constants.TORCH_LAUNCH_PARAMS``, kept for scripts).
TORCH_LAUNCH_PARAMS = ["nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf", "standalone",
                       "max_restarts", "monitor_interval", "start_method", "role", "module", "m", "no_python", "run_path",
                       "log_dir", "r", "redirects", "t", "tee", "node_rank", "master_addr", "master_port"]
def _filter_args(args: argparse.Namespace, parser: argparse.ArgumentParser,
                 default_args: list[str] | None = None) -> argparse.Namespace:
    """`parser`'s namespace for `default_args`, with every value `args` also has copied over (what torchrun takes).

    Example:
        >>> parser = argparse.ArgumentParser(); _ = parser.add_argument("--nnodes", default="1")
        >>> _filter_args(argparse.Namespace(nnodes="2", cpu=True), parser, [])
        Namespace(nnodes='2')
    """
    filtered, _ = parser.parse_known_args(default_args or [])
    for key, value in vars(args).items():
        if key in vars(filtered):
            setattr(filtered, key, value)
    return filtered


def _get_mpirun_args() -> tuple[str, str, str, str, str]:
    """The MPI program found on PATH and its flag names: hostfile, process count, per-node count, binding.

    Open MPI spells them ``--hostfile -n --npernode --bind-to``; Intel MPI and
    MVAPICH ``-f -n -ppn`` (no binding flag).
    """
    programs = [name for name in ("mpirun", "mpiexec") if which(name)]
    if not programs:
        raise OSError("mpirun or mpiexec were not found on PATH; install Intel MPI, Open MPI or MVAPICH (or drop "
                      "--mpirun_hostfile).")
    version = subprocess.check_output([programs[0], "--version"])
    if b"Open MPI" in version:
        return programs[0], "--hostfile", "-n", "--npernode", "--bind-to"
    return programs[0], "-f", "-n", "-ppn", ""


def _precision(args: argparse.Namespace) -> str:
    value = str(args.mixed_precision).lower()
    try:
        return PrecisionType(value).value
    except ValueError:
        raise ValueError(f"Unknown mixed_precision mode: {value}; choose one of {PrecisionType.list()}.") from None


def _fp8_variables(args: argparse.Namespace) -> dict[str, str]:
    """The ACCELERATE_FP8_* variables of the `--fp8_*` options given (through `fp8_settings`, their one writer)."""
    given = {key: value for key, value in vars(args).items() if key.startswith("fp8_") and value is not None}
    if isinstance(given.get("fp8_override_linear_precision"), (tuple, list)):  # three flags, as Accelerate parses them
        given["fp8_override_linear_precision"] = ",".join(str(flag) for flag in given["fp8_override_linear_precision"])
    return fp8_settings(given)


def _fp8(args: argparse.Namespace) -> dict[str, str]:
    if not is_fp8_available():
        raise RuntimeError("FP8 is not available on this machine: mixed_precision fp8 needs torchao or Transformer "
                           "Engine installed (pip install torchao).")
    return _fp8_variables(args)


def _parallelism(args: argparse.Namespace) -> dict[str, str]:
    """The PARALLELISM_CONFIG_* values Accelerate's launcher exports (sp and cp details only when those are on)."""
    keys = ["dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "cp_backend", "sp_size", "sp_backend"]
    if int(getattr(args, "parallelism_config_cp_size", 1) or 1) > 1:
        keys.append("cp_comm_strategy")
    if int(getattr(args, "parallelism_config_sp_size", 1) or 1) > 1:
        keys += ["sp_seq_length", "sp_seq_length_is_variable", "sp_attn_implementation"]
    return {key: str(getattr(args, f"parallelism_config_{key}", None)) for key in keys}


def spec_from_args(args: argparse.Namespace, launcher: str = "simple") -> LaunchSpec:
    """The launch spec of a filled launch namespace, for Accelerate's `launcher` of that name.

    `launcher` is "simple" (one process, or mpirun), "multi_gpu" (torchrun,
    also for FSDP) or "deepspeed": as in Accelerate, each exports only its
    own engine's settings.

    Example:
        >>> args = argparse.Namespace(mixed_precision="bf16", dynamo_backend="no", cpu=True, debug=False)
        >>> spec_from_args(args).mixed_precision
        'bf16'
    """
    if getattr(args, "use_megatron_lm", False) and launcher != "simple":
        raise ValueError("--use_megatron_lm: hasten has no Megatron-LM engine; use FSDP (--use_fsdp) or DeepSpeed "
                         "(--use_deepspeed) instead.")
    _precision(args)
    if str(args.mixed_precision).lower() == "fp8":
        _fp8(args)
    settings = settings_of_namespace(args)
    fsdp = launcher == "multi_gpu" and bool(getattr(args, "use_fsdp", False))
    if fsdp and settings.fsdp.fsdp_cpu_ram_efficient_loading and not settings.fsdp.fsdp_sync_module_states:
        raise ValueError("--fsdp_cpu_ram_efficient_loading needs --fsdp_sync_module_states true (the weights "
                         "loaded on the main process reach the others that way); set it or drop the former.")
    parallelism = _parallelism(args) if launcher != "simple" and getattr(args, "use_parallelism_config", False) else {}
    settings = dataclasses.replace(settings, use_fsdp=fsdp, use_deepspeed=launcher == "deepspeed",
                                   parallelism_config={f"parallelism_config_{k}": v for k, v in parallelism.items()})
    fields = getattr(args, "deepspeed_fields_from_accelerate_config", None)
    steps = getattr(args, "gradient_accumulation_steps", None) if launcher == "deepspeed" else None
    return spec_for(settings, steps, None if fields is None else str(fields))


def launcher_env(args: argparse.Namespace, spec: LaunchSpec) -> dict[str, str]:
    """What Accelerate's launcher sets besides its ACCELERATE_* variables: threads, visible GPUs, CPU tuning.

    Example:
        >>> launcher_env(argparse.Namespace(num_cpu_threads_per_process=4, gpu_ids="0,1"), LaunchSpec())
        {'OMP_NUM_THREADS': '4', 'CUDA_VISIBLE_DEVICES': '0,1'}
    """
    env = {"OMP_NUM_THREADS": str(getattr(args, "num_cpu_threads_per_process", None))}
    gpu_ids = getattr(args, "gpu_ids", None)
    if gpu_ids not in (None, "all"):
        env["CUDA_VISIBLE_DEVICES"] = str(gpu_ids)
    if spec.cpu:  # Intel OpenMP: threads pinned close together, brief spinning (Accelerate's simple launcher)
        env.update({"KMP_AFFINITY": "granularity=fine,compact,1,0", "KMP_BLOCKTIME": "1"})
    return env


def _environment(args: argparse.Namespace, spec: LaunchSpec, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment, plus the spec (for hasten), its ACCELERATE_* variables and the launcher's own."""
    env = os.environ.copy()
    env.update(spec.to_env())
    env.update(spec.peer_env({}))
    env.update(launcher_env(args, spec))
    env.update(extra or {})
    return env


def setup_fp8_env(args: argparse.Namespace, current_env: dict[str, str]) -> dict[str, str]:
    """Add the ACCELERATE_FP8_* variables of the `--fp8_*` options to `current_env` (and return it).

    Example:
        >>> setup_fp8_env(argparse.Namespace(fp8_margin=0), {})
        {'ACCELERATE_FP8_MARGIN': '0'}
    """
    current_env.update(_fp8_variables(args))
    return current_env


def prepare_simple_launcher_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The command and environment of Accelerate's simple launcher: one Python process, or mpirun's N.

    The command runs the script itself (``python script.py ARGS``), behind
    ``mpirun -hostfile ... -n N`` with `--mpirun_hostfile`.
    """
    if args.no_python and args.module:
        raise ValueError("--module and --no_python cannot be used together; keep one of them.")
    num_processes, num_machines = getattr(args, "num_processes", None), args.num_machines
    cmd: list[str] = []
    if args.mpirun_hostfile is not None:
        program, hostfile, count, per_node, bind = _get_mpirun_args()
        per_machine = str(num_processes // num_machines) if num_processes and num_machines else "1"
        cmd += [program, hostfile, args.mpirun_hostfile, per_node, per_machine]
        if num_processes:
            cmd += [count, str(num_processes)]
        if bind:
            cmd += [bind, getattr(args, "bind-to", "socket")]
    if not args.no_python:
        cmd += [sys.executable, "-m"] if args.module else [sys.executable]
    cmd += [args.training_script, *args.training_script_args]
    if num_machines > 1 and (args.main_process_ip is None or args.main_process_port is None):
        raise ValueError("a run on several machines needs --main_process_ip and --main_process_port.")
    spec = spec_from_args(args, "simple")
    extra = {}
    if (num_processes is not None and num_processes > 1) or num_machines > 1:
        extra = {"MASTER_ADDR": args.main_process_ip or "127.0.0.1",
                 "MASTER_PORT": str(args.main_process_port) if args.main_process_port is not None else "29500"}
    return cmd, _environment(args, spec, extra)


def _torchrun_layout(args: argparse.Namespace) -> None:
    """Accelerate's port choice and torchrun's layout arguments, set on `args` (as Accelerate sets them)."""
    if args.main_process_port == 0:
        args.main_process_port = get_free_port()
    elif args.main_process_port is None:
        args.main_process_port = 29500
    port = args.main_process_port
    if args.num_machines > 1:
        args.nproc_per_node = str(args.num_processes // args.num_machines)
        args.nnodes = str(args.num_machines)
        args.node_rank = int(args.machine_rank)
        if getattr(args, "same_network", False):
            args.master_addr, args.master_port = str(args.main_process_ip), str(port)
        else:
            args.rdzv_endpoint = f"{args.main_process_ip}:{port}"
    else:
        args.nproc_per_node = str(args.num_processes)
        args.master_port = str(port)
    # only the main machine checks: several launchers may share one machine on purpose
    if (args.num_machines <= 1 or int(args.machine_rank) == 0) and is_port_in_use(port):
        if args.num_machines > 1:
            raise ConnectionError(f"port {port} is already in use on the main machine; pass another "
                                  "--main_process_port (or set main_process_port in the config file).")
        args.standalone = True  # torchrun picks a free port itself
        warnings.warn(f"Port `{port}` is already in use; this launch lets torchrun find a free port instead. Pass "
                      "--main_process_port (0 picks a free one) to choose it.", stacklevel=3)
    if args.module and args.no_python:
        raise ValueError("--module and --no_python cannot be used together; keep one of them.")


def prepare_multi_gpu_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment of Accelerate's torchrun launcher (also FSDP's); sets torchrun's layout arguments on `args`."""
    _torchrun_layout(args)
    return _environment(args, spec_from_args(args, "multi_gpu"))


def prepare_extend_env_parallelism_config(args: argparse.Namespace, current_env: dict[str, str]) -> dict[str, str]:
    """Add the PARALLELISM_CONFIG_* variables of the `--parallelism_config_*` options to `current_env`."""
    current_env.update(LaunchSpec(parallelism=_parallelism(args)).peer_env({}))
    return current_env


def env_var_path_add(env_var_name: str, path_to_add: str) -> str:
    """The value of a path-list variable (PYTHONPATH ...) with `path_to_add` appended.

    Example:
        >>> env_var_path_add("SURELY_UNSET_PATH_VARIABLE", "/opt/x")
        '/opt/x'
    """
    paths = [part for part in os.environ.get(env_var_name, "").split(":") if part]
    return ":".join([*paths, str(path_to_add)])


def prepare_deepspeed_cmd_env(args: argparse.Namespace) -> tuple[list[str] | None, dict[str, str]]:
    """The command (several machines through DeepSpeed's own launcher, else None: torchrun) and the environment."""
    if args.deepspeed_multinode_launcher is None:
        args.deepspeed_multinode_launcher = DEEPSPEED_MULTINODE_LAUNCHERS[0]
    own_launcher = args.num_machines > 1 and args.deepspeed_multinode_launcher != DEEPSPEED_MULTINODE_LAUNCHERS[1]
    cmd = None
    if own_launcher:
        if args.main_process_port == 0:
            args.main_process_port = get_free_port()
        elif args.main_process_port is None:
            args.main_process_port = 29500
        cmd = ["deepspeed", "--hostfile", str(args.deepspeed_hostfile)]
        if args.deepspeed_multinode_launcher == "nossh":
            if compare_versions("deepspeed", "<", "0.14.5"):
                raise ValueError("the nossh launcher needs DeepSpeed 0.14.5 or newer; upgrade DeepSpeed.")
            cmd += ["--node_rank", str(args.machine_rank), "--no_ssh"]
        else:
            cmd += ["--no_local_rank", "--launcher", str(args.deepspeed_multinode_launcher)]
        if args.deepspeed_exclusion_filter is not None:
            cmd += ["--exclude", str(args.deepspeed_exclusion_filter)]
        elif args.deepspeed_inclusion_filter is not None:
            cmd += ["--include", str(args.deepspeed_inclusion_filter)]
        else:
            cmd += ["--num_gpus", str(args.num_processes // args.num_machines)]
        if args.main_process_ip:
            cmd += ["--master_addr", str(args.main_process_ip)]
        cmd += ["--master_port", str(args.main_process_port)]
        if args.module and args.no_python:
            raise ValueError("--module and --no_python cannot be used together; keep one of them.")
        cmd += ["--module"] if args.module else ["--no_python"] if args.no_python else []
        cmd += [args.training_script, *args.training_script_args]
    else:
        _torchrun_layout(args)
    return cmd, _environment(args, spec_from_args(args, "deepspeed"),
                             {"PYTHONPATH": env_var_path_add("PYTHONPATH", os.path.abspath("."))})


def prepare_tpu(args: argparse.Namespace, current_env: dict[str, str],
                pod: bool = False) -> tuple[argparse.Namespace, dict[str, str]]:
    """Accelerate's TPU environment: only the debug variable here (hasten has no TPU, so no XLA bf16 flags).

    Example:
        >>> prepare_tpu(argparse.Namespace(mixed_precision="no", debug=True), {})[1]
        {'ACCELERATE_DEBUG_MODE': 'true'}
    """
    if args.debug:
        current_env.update({key: value for key, value in LaunchSpec(debug=True).peer_env({}).items()
                            if key == "ACCELERATE_DEBUG_MODE"})
    if pod:  # the names torch_xla's pod launcher reads
        args.vm, args.tpu = args.tpu_vm, args.tpu_name
    return args, current_env


def run_deepspeed_itself(args: argparse.Namespace, resolved: ResolvedLaunch, switch: bool) -> int:
    """Several machines through DeepSpeed's own launcher (`deepspeed_multinode_launcher` other than `standard`).

    The refusals of `build_plan` come first; `--dry_run` prints the command.
    """
    from importlib.util import find_spec

    from ..launch.run import run_forwarding_signals
    from .launch_build import build_plan, switch_env
    from .launch_settings import namespace_view

    build_plan(args, resolved, in_this_process=False)
    view = namespace_view(resolved, argparse.Namespace(**vars(args)))
    view.deepspeed_fields_from_accelerate_config = ",".join(
        list(resolved.file.get("deepspeed_config") or {}) + ["mixed_precision"] * resolved.precision_from_file)
    cmd, env = prepare_deepspeed_cmd_env(view)
    assert cmd is not None  # several machines, not the standard launcher: DeepSpeed's own command
    if getattr(args, "dry_run", False):
        print(subprocess.list2cmdline(cmd))
        return 0
    if find_spec("deepspeed") is None:
        raise ImportError("DeepSpeed is not installed; pip install deepspeed (or build it from source).")
    previous = dict(os.environ)
    os.environ.clear()
    os.environ.update({**env, **(switch_env() if switch else {})})
    try:
        return run_forwarding_signals(cmd)
    finally:
        os.environ.clear()
        os.environ.update(previous)
