"""One launch command: `hasten launch` takes every flag of `accelerate launch`, and `accelerate launch` is it.

The two fronts share the flag table, the resolution of flags + config file and
the plan; these tests hold that (same settings, same plan for the same
argv), that each flag reaches what it names, that torchrun's own options
are passed through to torchrun, and that what hasten lacks is refused in
one sentence before anything starts.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hasten.cli.launch import launch_parser
from hasten.cli.launch_build import build_plan
from hasten.cli.launch_settings import resolve_config
from hasten.cli.launchers import _validate_launch_command, launch_command_parser
from hasten.launch.accelerate_config_file import ClusterConfig
from hasten.launch.config import DeepSpeedConfig, FSDPConfig, LaunchConfig, coerce, config_fields, field_type

ROOT = Path(__file__).resolve().parents[1]


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No config file anywhere: no $HASTEN_CONFIG_FILE, empty XDG and Hugging Face homes."""
    env = {k: v for k, v in os.environ.items() if k not in ("HASTEN_CONFIG_FILE", "HASTEN_LAUNCH_SPEC")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "xdg"), HF_HOME=str(tmp_path / "hf"), **extra)
    return env


def hasten(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hasten", "launch", *args], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=env or clean_env(tmp_path))


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('SCRIPT-RAN')\n")
    return path


@pytest.fixture
def no_file(tmp_path: Path) -> str:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    return str(empty)


def _dry_run(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    result = hasten(tmp_path, "--dry_run", *args, env=env)
    assert result.returncode == 0, result.stderr
    tokens = shlex.split(result.stdout.strip().splitlines()[-1])
    assignments = {}
    while tokens and "=" in tokens[0] and not tokens[0].startswith("/"):
        key, value = tokens.pop(0).split("=", 1)
        assignments[key] = value
    return assignments, tokens


# ---------------------------------------------------------------------------- Accelerate's flags, all of them
def test_every_flag_of_accelerate_launch_is_accepted_with_its_destination_and_default():
    path = ROOT / "scripts" / "api_coverage.py"
    spec = importlib.util.spec_from_file_location("api_coverage", path)
    coverage = importlib.util.module_from_spec(spec)
    sys.modules["api_coverage"] = coverage  # its dataclasses look their module up there
    spec.loader.exec_module(coverage)
    present, total, problems = coverage.compare_launch_flags()
    assert problems == [] and present == total > 200  # Accelerate 1.16 has 240 option strings


def test_the_two_fronts_resolve_and_plan_alike(tmp_path, script, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text("distributed_type: FSDP\nnum_processes: 4\nmixed_precision: bf16\nrdzv_backend: c10d\n"
                      "fsdp_config:\n  fsdp_sharding_strategy: SHARD_GRAD_OP\n  fsdp_version: 2\n")
    argv = ["--config_file", str(config), "--num-processes", "2", "--fsdp_offload_params", "true", "--tee", "3",
            "--main_process_port", "29577", str(script), "--lr", "1"]
    ours, theirs = launch_parser().parse_args(argv), launch_command_parser().parse_args(argv)
    resolved = [resolve_config(ours), resolve_config(theirs)]
    assert resolved[0].config == resolved[1].config
    plans = [build_plan(args, r, in_this_process=False) for args, r in zip((ours, theirs), resolved)]
    assert plans[0] == plans[1] and plans[0].torchrun_argv() == plans[1].torchrun_argv()
    plan = plans[0]
    assert plan.spec.fsdp == {"fsdp_sharding_strategy": "SHARD_GRAD_OP", "fsdp_version": 2, "fsdp_offload_params": True}
    # the flags given win, the file fills the rest: the file's rdzv_backend too (the parser's default does not hide it)
    assert (plan.num_processes, plan.spec.mixed_precision, plan.rdzv_backend, plan.tee) == (2, "bf16", "c10d", "3")
    args, defaults, from_file = _validate_launch_command(theirs)
    assert isinstance(defaults, ClusterConfig) and from_file is True
    assert (args.num_processes, args.use_fsdp, args.fsdp_sharding_strategy, args.rdzv_backend) == (
        2, True, "SHARD_GRAD_OP", "c10d")


# A sample command line for each config-file key that is a flag of its own, and the value it must reach.
SAMPLES = {
    "num_machines": (["--num_machines", "2", "--num_processes", "2", "--main_process_ip", "10.0.0.1"], 2),
    "min_machines": (["--num_machines", "1:2", "--num_processes", "2", "--main_process_ip", "10.0.0.1"], 1),
    "machine_rank": (["--machine_rank", "1", "--num_machines", "2", "--num_processes", "2",
                      "--main_process_ip", "10.0.0.1"], 1),
    "main_process_ip": (["--main_process_ip", "10.1.1.1"], "10.1.1.1"),
    "main_process_port": (["--main_process_port", "29555"], 29555),
    "rdzv_backend": (["--rdzv_backend", "c10d"], "c10d"),
    "same_network": (["--same_network"], True),
    "network_interface": (["--network_interface", "eth7"], "eth7"),
    "num_processes": (["--num_processes", "3"], 3),
    "gpu_ids": (["--gpu_ids", "0,1"], "0,1"),
    "use_cpu": (["--cpu"], True),
    "mixed_precision": (["--mixed_precision", "fp16"], "fp16"),
    "debug": (["--debug"], True),
    "max_restarts": (["--max_restarts", "2"], 2),
    "monitor_interval": (["--monitor_interval", "0.5"], 0.5),
    "liveness_timeout": (["--liveness_timeout", "30"], 30.0),
    "mpirun": (["--mpirun"], True),
    "mpirun_hostfile": (["--mpirun_hostfile", "hosts"], "hosts"),
    "use_deepspeed": (["--use_deepspeed"], True),
    "use_fsdp": (["--use_fsdp"], True),
    "enable_cpu_affinity": (["--enable_cpu_affinity"], True),
}
# Keys that are not a flag of their own, and why.
NOT_A_FLAG_OF_ITS_OWN = {
    "compute_environment": "describes the file only; SageMaker's is refused at launch",
    "distributed_type": "follows from --multi_cpu / --multi_gpu / --use_deepspeed / --use_fsdp / --cpu",
    "deepspeed_config": "each DeepSpeedConfig key is its own flag (checked below)",
    "fsdp_config": "each FSDPConfig key is its own flag (checked below)",
    "dynamo_config": "each key is its own --dynamo_* flag, as in accelerate launch",
    "fp8_config": "each key is its own --fp8_* flag, as in accelerate launch",
    "parallelism_config": "each key is its own --parallelism_config_* flag, as in accelerate launch",
    "main_training_function": "a flag of accelerate launch's TPU group (refused); the file's key is for notebooks",
}


def test_every_config_key_is_a_flag_that_reaches_the_config(no_file):
    assert set(SAMPLES) | set(NOT_A_FLAG_OF_ITS_OWN) == {f.name for f in config_fields(LaunchConfig)}
    for name, (flags, expected) in SAMPLES.items():
        args = launch_parser().parse_args(["--config_file", no_file, *flags, "train.py"])
        assert getattr(resolve_config(args).config, name) == expected, name


@pytest.mark.parametrize("schema, section", [(DeepSpeedConfig, "deepspeed"), (FSDPConfig, "fsdp")])
def test_every_section_key_is_a_flag_that_reaches_the_launch_spec(schema, section, no_file, script):
    switch = "--use_deepspeed" if section == "deepspeed" else "--use_fsdp"
    for f in dataclasses.fields(schema):
        if f.name == "fsdp_ignored_modules":  # a key of Accelerate's files, no flag of its launcher (tested below)
            continue
        value = str((f.metadata["choices"] or [{bool: "true", int: "1", float: "0.5"}.get(field_type(f), "x")])[-1])
        args = launch_parser().parse_args(["--config_file", no_file, switch, f"--{f.name}", value, str(script)])
        spec = build_plan(args, resolve_config(args)).spec
        assert getattr(spec, section)[f.name] == coerce(f, value, f.name), f.name


# ---------------------------------------------------------------------------- refused, in one sentence
@pytest.mark.parametrize("flags, words", [
    (["--tpu"], "--tpu: hasten has no TPU"),
    (["--tpu_cluster"], "--tpu_cluster: hasten has no TPU"),
    (["--no_tpu_cluster"], "--no_tpu_cluster: hasten has no TPU"),
    (["--vm", "w-1"], "--vm: hasten has no TPU"),
    (["--env", "A=1"], "--env: hasten has no TPU"),
    (["--main_training_function", "main"], "--main_training_function: hasten has no TPU"),
    (["--downcast_bf16"], "--downcast_bf16: hasten has no TPU"),
    (["--use_megatron_lm"], "--use_megatron_lm: hasten has no Megatron-LM engine"),
    (["--megatron_lm_tp_degree", "2"], "--megatron_lm_tp_degree: hasten has no Megatron-LM engine"),
    (["--aws_access_key_id", "K"], "--aws_access_key_id: hasten launches no Amazon SageMaker job"),
    (["--zero_stage", "3"], "--zero_stage is a DeepSpeed option; add --use_deepspeed."),
    (["--rdzv_conf", "oops"], "--rdzv_conf 'oops' must be key=value pairs"),
    (["--mpirun", "--tee", "3"], "--tee: torchrun's options, but mpirun starts this run"),
    (["-m", "--no_python"], "--module and --no_python cannot be used together"),
    (["--num_cpu_threads_per_process", "0"], "--num_cpu_threads_per_process must be at least 1"),
    (["--multi_gpu", "--num_processes", "1"], "--multi_gpu needs at least 2 processes"),
])
def test_what_cannot_work_is_refused_in_one_line_before_anything_starts(tmp_path, script, flags, words):
    result = hasten(tmp_path, *flags, str(script))
    assert result.returncode == 2 and words in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and "SCRIPT-RAN" not in result.stdout


def test_fsdp_ignored_modules_by_name_reach_the_plugin(tmp_path, script):
    """A config file's fsdp_ignored_modules (a regular expression of module names, as Accelerate reads it) reaches
    the FSDP plugin the Accelerator builds from the launch spec; Accelerate's null is no value."""
    from hasten.strategies.fsdp.plugin import FullyShardedDataParallelPlugin

    config = tmp_path / "c.yaml"
    config.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_ignored_modules: null\n")
    assert hasten(tmp_path, "--dry_run", "--config_file", str(config), str(script)).returncode == 0  # Accelerate's null
    config.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_ignored_modules: 'head.*'\n")
    args = launch_parser().parse_args(["--config_file", str(config), str(script)])
    spec = build_plan(args, resolve_config(args)).spec
    assert FullyShardedDataParallelPlugin.from_launch_config(spec.fsdp).ignored_modules == "head.*"


def test_a_sagemaker_config_is_refused_in_one_line(tmp_path, script):
    config = tmp_path / "sm.yaml"
    config.write_text("compute_environment: AMAZON_SAGEMAKER\ndistributed_type: 'NO'\nmixed_precision: fp16\n"
                      "ec2_instance_type: ml.p3.2xlarge\niam_role_name: role\n")
    result = hasten(tmp_path, "--config_file", str(config), str(script))
    assert result.returncode == 2 and "hasten launches no Amazon SageMaker job" in result.stderr
    assert result.stderr.count("\n") == 1


# ---------------------------------------------------------------------------- passed on, and honoured
def test_torchrun_options_reach_torchrun_even_for_one_process(tmp_path, script):
    env, argv = _dry_run(tmp_path, "--tee", "3", "--role", "trainer", "--rdzv_conf", "join_timeout=5,close_timeout=2",
                         "--num_cpu_threads_per_process", "3", str(script))
    assert argv[1:3] == ["-m", "torch.distributed.run"]
    assert {"--tee=3", "--role=trainer", "--rdzv-conf=join_timeout=5,close_timeout=2"} <= set(argv)
    assert env["OMP_NUM_THREADS"] == "3"
    env, argv = _dry_run(tmp_path, "--no_python", "--num_processes", "2", "--cpu", "/bin/echo", "hi")
    assert argv[-3:] == ["--no-python", "/bin/echo", "hi"] and "hasten.launch.worker" not in argv
    assert json.loads(_dry_run(tmp_path, "--enable_cpu_affinity", str(script))[0]["HASTEN_LAUNCH_SPEC"])["cpu_affinity"]


def test_port_zero_is_a_free_port_as_in_accelerate(tmp_path, script):
    _, argv = _dry_run(tmp_path, "--num_processes", "2", "--cpu", "--main_process_port", "0", str(script))
    port = int(next(a for a in argv if a.startswith("--master-port=")).split("=")[1])
    assert 0 < port < 65536


def test_accelerates_default_file_is_read_when_hasten_has_none(tmp_path, script):
    default = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    default.parent.mkdir(parents=True)
    default.write_text("distributed_type: MULTI_CPU\nnum_processes: 3\nuse_cpu: true\nmixed_precision: bf16\n")
    _, argv = _dry_run(tmp_path, str(script))
    assert "--nproc-per-node=3" in argv
    hastens = tmp_path / "xdg" / "hasten" / "default_config.yaml"
    hastens.parent.mkdir(parents=True)
    hastens.write_text("num_processes: 2\nuse_cpu: true\n")
    assert "--nproc-per-node=2" in _dry_run(tmp_path, str(script))[1]  # hasten's own default file comes first


def test_no_python_runs_an_executable_as_a_child(tmp_path):
    program = tmp_path / "run.sh"
    program.write_text("#!/bin/sh\necho \"ran with $# args, spec ${HASTEN_LAUNCH_SPEC:+set}\"\n")
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    result = hasten(tmp_path, "--no_python", str(program), "a", "b")
    assert result.returncode == 0 and result.stdout.strip() == "ran with 2 args, spec set", result.stderr


def test_accelerate_front_warns_about_defaults_as_accelerate_does(tmp_path, script, caplog, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("HASTEN_CONFIG_FILE", raising=False)
    import hasten.launch.accelerate_config_file as files

    monkeypatch.setattr(files, "default_config_file", str(tmp_path / "none.yaml"))
    with caplog.at_level(logging.WARNING):
        args, defaults, _ = _validate_launch_command(launch_command_parser().parse_args(["--cpu", str(script)]))
    assert defaults is None and args.num_processes == 1 and args.num_machines == 1 and args.mixed_precision == "no"
    assert "`--num_processes` was set to a value of `1`" in caplog.text
    assert "`--mixed_precision` was set to a value of `'no'`" in caplog.text


@pytest.mark.multiprocess
def test_tee_prefixes_ranks_and_log_dir_keeps_the_logs(tmp_path, script):
    from conftest import run_with_timeout

    logs = tmp_path / "logs"
    command = [sys.executable, "-m", "hasten", "launch", "--num_processes", "2", "--cpu", "--tee", "3",
               "--log_dir", str(logs), str(script)]
    result = run_with_timeout(command, 120, clean_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert {"[default0]:SCRIPT-RAN", "[default1]:SCRIPT-RAN"} <= set(result.stdout.splitlines())
    kept = sorted(p.relative_to(logs).parts[-2:] for p in logs.rglob("stdout.log"))
    assert kept == [("0", "stdout.log"), ("1", "stdout.log")]
    assert all(p.read_text().strip() == "SCRIPT-RAN" for p in logs.rglob("stdout.log"))
