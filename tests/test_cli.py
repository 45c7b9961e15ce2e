"""`hasten launch` argument handling: refused before anything starts, one sentence each."""

import json
import subprocess
import sys

import pytest

from hasten.launch.plan import LaunchError, LaunchPlan, find_free_port
from hasten.launch.failures import root_cause
from hasten.process.launch_spec import SPEC_ENV_VAR, LaunchSpec


def hasten(*args, cwd=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "hasten", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('SCRIPT-RAN')\n")
    return path


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--num_processes", "0"], "num_processes must be at least 1, got 0."),
        (["--num_processes", "two"], "invalid int value: 'two'"),
        (["--mixed_precision", "fp32"], "invalid choice: 'fp32'"),
        (["--main_process_port", "70000", "--num_processes", "2"], "main_process_port must be between 1 and 65535"),
        (["--gradient_accumulation_steps", "0"], "--gradient_accumulation_steps must be at least 1"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_nonsense_flags_get_one_sentence(script, flags, message):
    result = hasten("launch", *flags, str(script))
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr  # one line, no usage dump, no traceback
    assert "SCRIPT-RAN" not in result.stdout


def test_missing_script(tmp_path):
    result = hasten("launch", str(tmp_path / "nope.py"))
    assert result.returncode == 2
    assert "does not exist" in result.stderr and result.stderr.count("\n") == 1


def test_port_in_use_is_refused(script):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = hasten("launch", "--num_processes", "2", "--main_process_port", str(port), str(script))
    assert result.returncode == 2
    assert f"port {port} on 127.0.0.1 is already in use" in result.stderr


def test_dry_run_prints_command_and_one_spec(script):
    result = hasten("launch", "--dry_run", "--num_processes", "2", "--cpu", "--mixed_precision", "bf16",
                    str(script), "--lr", "3")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "torch.distributed.run" in out and "--nproc-per-node=2" in out and "--master-addr=127.0.0.1" in out
    assert out.rstrip().endswith(f"-m hasten.launch.worker {script} --lr 3")
    spec_json = out.split(f"{SPEC_ENV_VAR}='", 1)[1].split("'", 1)[0]
    assert LaunchSpec(**json.loads(spec_json)) == LaunchSpec(mixed_precision="bf16", cpu=True)
    assert "SCRIPT-RAN" not in out


def test_help_does_not_import_torch():
    code = ("import sys; from hasten.cli.main import main\n"
            "try:\n    main(['launch', '--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "--num_processes" in result.stdout


def test_single_process_runs_script_directly(script):
    result = hasten("launch", str(script))
    assert result.returncode == 0 and result.stdout.strip() == "SCRIPT-RAN"


def test_single_process_failure_exit_code(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("raise KeyError('missing')\n")
    result = hasten("launch", str(bad))
    assert result.returncode == 1
    assert "rank 0 failed with KeyError" in result.stderr and "bad.py" in result.stderr
    exits = tmp_path / "exits.py"
    exits.write_text("import sys; sys.exit(3)\n")
    assert hasten("launch", str(exits)).returncode == 3


def test_plan_is_a_plain_value(tmp_path, script):
    plan = LaunchPlan(target=str(script), target_args=("a",), num_processes=3).validate()
    assert 0 < plan.main_process_port < 65536  # a free port was chosen
    env = plan.worker_env({"PATH": "/bin"})
    assert env["PATH"] == "/bin" and LaunchSpec.from_env(env) == LaunchSpec()
    assert env["OMP_NUM_THREADS"] == str(max(1, len(__import__("os").sched_getaffinity(0)) // 3))
    assert plan.worker_env({"OMP_NUM_THREADS": "7"})["OMP_NUM_THREADS"] == "7"  # the user's choice wins
    module_plan = LaunchPlan(target="pkg.train", module=True, num_processes=2, main_process_port=find_free_port())
    assert module_plan.validate().worker_argv() == ["--module", "pkg.train"]
    with pytest.raises(LaunchError, match="does not exist"):
        LaunchPlan(target=str(tmp_path / "missing.py")).validate()


def test_spec_from_env_rejects_garbage(no_fp8_backend):
    with pytest.raises(ValueError, match="not valid JSON"):
        LaunchSpec.from_env({SPEC_ENV_VAR: "{"})
    with pytest.raises(ValueError, match="unknown keys"):
        LaunchSpec.from_env({SPEC_ENV_VAR: '{"warp": 9}'})
    with pytest.raises(ValueError, match="mixed_precision='fp8'"):
        LaunchSpec.from_env({SPEC_ENV_VAR: '{"mixed_precision": "fp8"}'})


class _Failure:
    def __init__(self, message, timestamp, exitcode=1):
        self.message, self.timestamp, self.exitcode = message, timestamp, exitcode


def test_root_cause_skips_collateral_failures():
    failures = {
        0: _Failure({"message": "RuntimeError: [gloo] Connection closed by peer [127.0.0.1]"}, 100),
        1: _Failure({"message": "ValueError: boom"}, 100),
    }
    assert root_cause(failures)[0] == 1
    assert root_cause({0: failures[0]})[0] == 0  # nothing better: report what there is


def test_root_cause_skips_ranks_stopped_by_the_launcher():
    import signal

    failures = {
        0: _Failure("Signal 15 (SIGTERM) received by PID 12", 100, exitcode=-signal.SIGTERM),
        1: _Failure({"message": "ValueError: boom"}, 100),
    }
    assert root_cause(failures)[0] == 1


def test_an_error_file_a_stopped_worker_left_half_written_is_no_root_cause(tmp_path):
    """Seen in CI: rank 0, stopped while writing its error file, left it empty; the launcher raised JSONDecodeError."""
    import json

    from hasten.launch.failures import all_failures, failure_summary

    attempt = tmp_path / "run_x" / "attempt_0"
    (attempt / "0").mkdir(parents=True)
    (attempt / "1").mkdir()
    (attempt / "0" / "error.json").write_text("")  # cut short by the stop
    (attempt / "1" / "error.json").write_text(json.dumps({"message": {
        "message": "ValueError: boom", "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "100"}}}))
    found = all_failures({}, str(tmp_path), first_rank=0)
    assert sorted(found) == [0, 1]
    assert root_cause(found)[0] == 1
    assert failure_summary(found, 2) == ("hasten launch: rank 1 of 2 failed with ValueError: boom (traceback above); "
                                         "1 other rank(s) ended too: 0.")


def test_failure_summary_wording():
    import signal

    from hasten.launch.failures import failure_summary

    raised = {0: _Failure("Signal 15", 5, exitcode=-signal.SIGTERM), 1: _Failure({"message": "ValueError: boom"}, 5)}
    assert failure_summary(raised, 2) == ("hasten launch: rank 1 of 2 failed with ValueError: boom (traceback above); "
                                          "the other ranks were stopped.")
    exited = {0: _Failure("", 5, exitcode=1), 1: _Failure("", 5, exitcode=1)}
    assert failure_summary(exited, 2) == "hasten launch: rank 0 of 2 exited with code 1; 1 other rank(s) ended too: 1."
    killed = {1: _Failure("Signal 9", 5, exitcode=-9)}
    assert "rank 1 of 2 was killed by SIGKILL (out of memory?)." in failure_summary(killed, 2)


def test_config_keys_hasten_does_not_use_are_named_not_silently_dropped(script, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("use_cpu: true\nnum_processes: 1\ntpu_name: pod-1\ndowncast_bf16: false\n")
    result = hasten("launch", "--config_file", str(config), str(script))
    assert result.returncode == 0 and "SCRIPT-RAN" in result.stdout
    notes = [line for line in result.stderr.splitlines() if "is not used by hasten" in line]
    assert notes == ["hasten launch: note: the config file's tpu_name (TPU only) is not used by hasten; "
                     "remove it from the file to silence this note."]  # downcast_bf16 holds its default: no note
    assert "not used" not in hasten("launch", "-q", "--config_file", str(config), str(script)).stderr


@pytest.mark.multiprocess
def test_a_config_files_parallelism_config_builds_the_mesh_as_accelerate_launch_does(tmp_path):
    from conftest import launch

    probe = tmp_path / "probe.py"
    probe.write_text(  # one file per rank: two ranks' prints can share a line of the launcher's output
        "import json, os, sys\nfrom pathlib import Path\nfrom hasten import Accelerator\naccelerator = Accelerator(cpu=True)\n"
        "config, mesh = accelerator.parallelism_config, accelerator.torch_device_mesh\n"
        "Path(sys.argv[1], f'rank{accelerator.process_index}.json').write_text(json.dumps({"
        "'dims': list(mesh.mesh_dim_names), 'sizes': [config.dp_replicate_size, config.dp_shard_size],"
        " 'type': accelerator.distributed_type.value,"
        " 'env': {k: v for k, v in os.environ.items() if 'PARALLELISM_CONFIG' in k}}))\n")
    config = tmp_path / "config.yaml"
    config.write_text("use_cpu: true\nparallelism_config:\n  parallelism_config_dp_shard_size: 2\n")
    launch(probe, str(tmp_path), num_processes=2, launch_args=("--config_file", str(config)))
    seen = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for record in seen:
        assert record == {"dims": ["dp_shard"], "sizes": [1, 2], "type": "FSDP",
                          "env": {"ACCELERATE_USE_PARALLELISM_CONFIG": "true", "PARALLELISM_CONFIG_DP_SHARD_SIZE": "2"}}


@pytest.mark.parametrize("flags, message", [
    (["--num_processes", "2", "--parallelism_config_dp_shard_size", "4"],
     "the parallelism_config sizes multiply to 4 but --num_processes is 2"),
    (["--num_processes", "4", "--parallelism_config_sp_size", "3"], "parallelism_config_sp_size 3 does not divide"),
    (["--parallelism_config_cp_comm_strategy", "ring"], "invalid choice: 'ring'"),
])
def test_parallelism_flags_that_cannot_work_are_refused_before_anything_starts(script, flags, message):
    result = hasten("launch", "--cpu", *flags, str(script))
    assert result.returncode == 2 and message in result.stderr and "SCRIPT-RAN" not in result.stdout


def test_fp8_settings_reach_the_recipe_as_under_accelerate_launch(tmp_path, monkeypatch):
    pytest.importorskip("torchao")
    from conftest import launch

    probe = tmp_path / "probe.py"
    probe.write_text(
        "import json, os\nfrom hasten import Accelerator\naccelerator = Accelerator(cpu=True)\n"
        "config = accelerator.ao_recipe_handler.config\n"
        "print(json.dumps([accelerator.mixed_precision, accelerator.fp8_backend.value, config.pad_inner_dim,"
        " config.enable_fsdp_float8_all_gather, os.environ['ACCELERATE_FP8_BACKEND']]))\n")
    config = tmp_path / "config.yaml"
    config.write_text("use_cpu: true\nmixed_precision: fp8\nfp8_config:\n  backend: AO\n  fp8_pad_inner_dim: false\n")
    flags = ("--config_file", str(config), "--fp8_enable_fsdp_float8_all_gather", "false")
    assert json.loads(launch(probe, num_processes=1, launch_args=flags).stdout.splitlines()[-1]) == [
        "fp8", "AO", False, False, "AO"]
    refused = hasten("launch", "--cpu", "--fp8_backend", "ao", str(probe))
    assert refused.returncode == 2 and "fp8 settings were given but mixed_precision is 'no'" in refused.stderr
    # the recipe reads the same variables as Accelerate's, with the same defaults
    from accelerate.utils import AORecipeKwargs as PeerRecipe

    from hasten.utils import AORecipeKwargs

    for value in ("false", None):
        if value is None:
            monkeypatch.delenv("ACCELERATE_FP8_PAD_INNER_DIM", raising=False)
        else:
            monkeypatch.setenv("ACCELERATE_FP8_PAD_INNER_DIM", value)
        assert AORecipeKwargs().config.pad_inner_dim == PeerRecipe().config.pad_inner_dim == (value is None)
