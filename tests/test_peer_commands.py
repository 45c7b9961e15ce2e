"""Accelerate's command-line API (`hasten.commands.*`, `hasten.utils.launch`): Accelerate's meaning, hasten's launcher."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hasten.commands.config.config_args import ClusterConfig, load_config_from_file
from hasten.commands.launch import _validate_launch_command, launch_command, launch_command_parser
from hasten.launch.config import load_config
from hasten.process.launch_spec import SPEC_ENV_VAR
from hasten.utils import write_basic_config
from hasten.utils.launch import prepare_multi_gpu_env, prepare_simple_launcher_cmd_env

ROOT = Path(__file__).resolve().parents[1]


def _parsed(tmp_path: Path, *argv: str) -> argparse.Namespace:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    args = launch_command_parser().parse_args([*argv, str(script), "--lr", "1"])
    return _validate_launch_command(args)[0]


def test_the_command_line_wins_over_the_config_file_which_fills_the_rest(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("distributed_type: 'NO'\ndebug: true\nmixed_precision: bf16\nfsdp_config:\n"
                      "  fsdp_sync_module_states: false\n  fsdp_offload_params: true\n")
    args = _parsed(tmp_path, "--config_file", str(config), "--fsdp_offload_params", "false")
    assert (args.debug, args.mixed_precision, args.fsdp_sync_module_states, args.fsdp_offload_params) == \
        (True, "bf16", False, "false")


def test_the_environments_carry_the_spec_and_accelerates_variables(tmp_path):
    args = _parsed(tmp_path, "--cpu", "--mixed_precision", "bf16", "--num_cpu_threads_per_process", "3")
    cmd, env = prepare_simple_launcher_cmd_env(args)
    assert cmd == [sys.executable, str(tmp_path / "train.py"), "--lr", "1"]
    assert json.loads(env[SPEC_ENV_VAR])["mixed_precision"] == "bf16"
    assert (env["ACCELERATE_MIXED_PRECISION"], env["ACCELERATE_USE_CPU"], env["OMP_NUM_THREADS"]) == ("bf16", "True", "3")
    args = _parsed(tmp_path, "--use_fsdp", "--num_processes", "2", "--main_process_port", "0")
    env = prepare_multi_gpu_env(args)
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_SYNC_MODULE_STATES"] == "true"
    assert args.nproc_per_node == "2" and args.master_port.isdigit() and args.master_port != "0"


def test_launch_command_runs_the_script_in_a_child_with_the_switch_on(tmp_path, capfd):
    script = tmp_path / "train.py"
    script.write_text("import os, accelerate\nprint('ran', accelerate.__name__, os.environ['ACCELERATE_MIXED_PRECISION'], "
                      "os.getpid())\n")
    args = launch_command_parser().parse_args(["--num_processes", "1", "--mixed_precision", "no", "--num_machines", "1",
                                               "--dynamo_backend", "no", str(script)])
    launch_command(args)
    line = next(line for line in capfd.readouterr().out.splitlines() if line.startswith("ran "))
    assert line.split()[:3] == ["ran", "hasten", "no"] and int(line.split()[3]) != os.getpid()  # a child process
    script.write_text("raise SystemExit(3)\n")
    with pytest.raises(subprocess.CalledProcessError):
        launch_command(launch_command_parser().parse_args(["--num_processes", "1", str(script)]))


def test_write_basic_config_writes_accelerates_file_which_both_launchers_read(tmp_path):
    path = write_basic_config("fp16", tmp_path / "default_config.yaml")
    assert isinstance(load_config_from_file(str(path)), ClusterConfig)
    assert load_config(path).mixed_precision == "fp16"


def test_a_patch_through_the_switch_reaches_the_code_and_is_undone():
    code = (
        "import hasten.as_accelerate\n"
        "from unittest.mock import patch\n"
        "import hasten.cli.launcher_env as home, shutil\n"
        "from accelerate.utils.launch import _get_mpirun_args\n"
        "with patch('accelerate.utils.launch.which', return_value=None):\n"
        "    assert home.which is not shutil.which\n"
        "    try:\n"
        "        _get_mpirun_args()\n"
        "    except OSError:\n"
        "        print('patched')\n"
        "print(home.which is shutil.which)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.stdout.split() == ["patched", "True"], result.stderr
