"""The config file: Accelerate-written YAML is honoured, bad files get one clear sentence, flags beat the file.

Fixtures in tests/data/ are laid out the way `accelerate config` writes them
(sorted keys, quoted 'NO' / 'no', tpu_* and downcast_bf16 present).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hasten.launch.config import (
    ConfigError,
    DeepSpeedConfig,
    FSDPConfig,
    LaunchConfig,
    config_fields,
    default_of,
    load_config,
    save_config,
)

DATA = Path(__file__).parent / "data"


# ---------------------------------------------------------------------------- helpers
def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The caller's environment without any config file: no $HASTEN_CONFIG_FILE, empty XDG and Hugging Face homes."""
    env = {k: v for k, v in os.environ.items() if k not in ("HASTEN_CONFIG_FILE", "HASTEN_LAUNCH_SPEC")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    env["HF_HOME"] = str(tmp_path / "hf")  # nor Accelerate's default file, which a launch reads when hasten has none
    env.update(extra)
    return env


def hasten(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hasten", *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=cwd)


@dataclasses.dataclass
class DryRun:
    returncode: int
    stdout: str
    stderr: str
    env: dict[str, str]
    argv: list[str]

    @property
    def spec(self) -> dict:
        return json.loads(self.env["HASTEN_LAUNCH_SPEC"])

    def has(self, *flags: str) -> bool:
        return all(flag in self.argv for flag in flags)


def dry_run(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> DryRun:
    """`hasten launch --dry_run ... train.py`, its printed command split into env assignments and argv."""
    script = tmp_path / "train.py"
    script.write_text("print('SCRIPT-RAN')\n")
    result = hasten("launch", "--dry_run", *flags, str(script), env=env or clean_env(tmp_path))
    assignments: dict[str, str] = {}
    argv: list[str] = []
    if result.returncode == 0:
        tokens = shlex.split(result.stdout.strip())
        while tokens and "=" in tokens[0] and not tokens[0].startswith("/"):
            key, value = tokens.pop(0).split("=", 1)
            assignments[key] = value
        argv = tokens
        assert argv[-1] == str(script) and "SCRIPT-RAN" not in result.stdout
    return DryRun(result.returncode, result.stdout, result.stderr, assignments, argv)


def one_sentence(message: str) -> bool:
    """A single line, ending with a full stop (no traceback, no usage dump)."""
    return "\n" not in message.strip() and message.strip().endswith(".") and "Traceback" not in message


# ---------------------------------------------------------------------------- Accelerate-written files
FIXTURES = {
    "accelerate_single_cpu.yaml": dict(distributed_type="NO", num_processes=1, use_cpu=True, mixed_precision="no",
                                       num_machines=1, gpu_ids="all", use_deepspeed=False, use_fsdp=False),
    "accelerate_multi_cpu.yaml": dict(distributed_type="MULTI_CPU", num_processes=4, use_cpu=True,
                                      mixed_precision="bf16", main_process_ip="127.0.0.1", main_process_port=29500,
                                      mpirun=True, mpirun_hostfile="/home/user/hostfile",
                                      ipex_config={"ipex": False}),
    "accelerate_multi_gpu.yaml": dict(distributed_type="MULTI_GPU", num_processes=2, use_cpu=False, gpu_ids="0,2",
                                      mixed_precision="fp16", debug=True, main_process_port=None),
    "accelerate_multi_gpu.json": dict(distributed_type="MULTI_GPU", num_processes=2, gpu_ids="1,3",
                                      mixed_precision="bf16"),
    "accelerate_two_machines_c10d.yaml": dict(distributed_type="MULTI_GPU", num_machines=2, machine_rank=1,
                                              num_processes=16, main_process_ip="10.0.0.1", main_process_port=29501,
                                              rdzv_backend="c10d", same_network=False, mixed_precision="bf16"),
    "accelerate_deepspeed_zero3_offload.yaml": dict(distributed_type="DEEPSPEED", use_deepspeed=True, use_fsdp=False,
                                                    num_processes=8, mixed_precision="bf16"),
    "accelerate_fsdp_transformer_wrap.yaml": dict(distributed_type="FSDP", use_fsdp=True, use_deepspeed=False,
                                                  num_processes=4, mixed_precision="bf16"),
    "accelerate_old_fsdp.yaml": dict(distributed_type="FSDP", use_fsdp=True, mixed_precision="fp16", num_processes=2,
                                     gpu_ids="all", main_process_ip=None, main_process_port=None,
                                     dynamo_config={"dynamo_backend": "INDUCTOR"}),
}


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_accelerate_files_are_honoured(name):
    config = load_config(DATA / name)
    for key, expected in FIXTURES[name].items():
        assert getattr(config, key) == expected, f"{name}: {key}"
    assert config.processes_per_machine * config.num_machines == config.num_processes


def test_accelerate_deepspeed_section():
    ds = load_config(DATA / "accelerate_deepspeed_zero3_offload.yaml").deepspeed
    assert isinstance(ds, DeepSpeedConfig)
    assert (ds.zero_stage, ds.offload_optimizer_device, ds.offload_param_device) == (3, "cpu", "cpu")
    assert ds.zero3_init_flag is True and ds.zero3_save_16bit_model is True
    assert ds.gradient_accumulation_steps == 4 and ds.gradient_clipping == 1.0
    assert ds.deepspeed_multinode_launcher == "standard"


def test_accelerate_fsdp_section():
    fsdp = load_config(DATA / "accelerate_fsdp_transformer_wrap.yaml").fsdp
    assert isinstance(fsdp, FSDPConfig)
    assert fsdp.fsdp_version == 1
    assert fsdp.fsdp_sharding_strategy == "SHARD_GRAD_OP"
    assert fsdp.fsdp_auto_wrap_policy == "TRANSFORMER_BASED_WRAP"
    assert fsdp.fsdp_transformer_layer_cls_to_wrap == "LlamaDecoderLayer"
    assert fsdp.fsdp_state_dict_type == "FULL_STATE_DICT"
    assert fsdp.fsdp_activation_checkpointing is True


def test_old_accelerate_file_is_migrated_on_load():
    config = load_config(DATA / "accelerate_old_fsdp.yaml")
    fsdp = config.fsdp
    assert fsdp.fsdp_sharding_strategy == "SHARD_GRAD_OP"  # was the number 2
    assert fsdp.fsdp_backward_prefetch == "BACKWARD_POST"  # was fsdp_backward_prefetch_policy
    assert fsdp.fsdp_offload_params is True
    assert "fsdp_backward_prefetch_policy" not in config.fsdp_config


@pytest.mark.parametrize(
    "text, key, expected",
    [
        ("mixed_precision: no\n", "mixed_precision", "no"),  # unquoted YAML `no` is the boolean False
        ("distributed_type: NO\n", "distributed_type", "NO"),
        ("mixed_precision: null\n", "mixed_precision", "no"),  # null = the default, not None
        ("rdzv_backend: null\n", "rdzv_backend", "static"),
        ("gpu_ids: [0, 1]\n", "gpu_ids", "0,1"),
        ("gpu_ids: 3\n", "gpu_ids", "3"),
        ("downcast_bf16: 'no'\n", "downcast_bf16", False),
        ("num_processes: -1\n", "num_processes", 1),  # Accelerate's "decide at launch time"
    ],
)
def test_hand_edited_values_are_read_as_meant(tmp_path, text, key, expected):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert getattr(load_config(path), key) == expected


def test_fsdp_layer_list_becomes_comma_separated(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_transformer_layer_cls_to_wrap: [T5Block, T5Stack]\n")
    assert load_config(path).fsdp.fsdp_transformer_layer_cls_to_wrap == "T5Block,T5Stack"


# ---------------------------------------------------------------------------- bad files: one clear sentence
def test_unknown_key_is_named_with_a_hint(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text((DATA / "accelerate_multi_gpu.yaml").read_text() + "num_proceses: 2\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert "'num_proceses'" in message and "did you mean num_processes?" in message
    assert str(path) in message and one_sentence(message)


def test_unknown_nested_key_is_named_with_a_hint(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stag: 3\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path).deepspeed
    message = str(caught.value)
    assert "deepspeed_config.zero_stag" in message and "did you mean deepspeed_config.zero_stage?" in message
    assert one_sentence(message)


def test_unknown_key_without_close_match_says_remove_it(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("ec2_instance_type: ml.p3.2xlarge\n")
    with pytest.raises(ConfigError, match=r"unknown key 'ec2_instance_type'.*remove it or fix its name\.$"):
        load_config(path)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("mixed_precision: fp32\n", "mixed_precision='fp32' is not one of 'no', 'fp16', 'bf16', 'fp8'."),
        ("num_processes: two\n", "num_processes='two' is not a valid int."),
        ("use_cpu: maybe\n", "use_cpu='maybe' is not a valid bool."),
        ("num_machines: 2\nmachine_rank: 2\nnum_processes: 2\nmain_process_ip: 10.0.0.1\n",
         "machine_rank 2 is not below num_machines 2; use a rank from 0 to 1."),
        ("num_machines: 2\nnum_processes: 3\nmain_process_ip: 10.0.0.1\n",
         "num_processes 3 (the total across machines) is not divisible by num_machines 2"),
        ("num_machines: 2\nnum_processes: 4\n", "a run on several machines needs main_process_ip"),
        ("main_process_port: 70000\n", "main_process_port must be between 1 and 65535 (or 0: a free one), got 70000."),
        ("use_deepspeed: true\nuse_fsdp: true\n", "DeepSpeed and FSDP cannot be used together"),
        ("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: 7\n",
         "fsdp_config.fsdp_sharding_strategy='7' is not one of"),
        ("distributed_type: XLA\n", "distributed_type='XLA' is not one of"),
        ("main_process_ip: {a: 1}\n", "main_process_ip={'a': 1} is not a valid str."),
    ],
)
def test_invalid_values_get_one_sentence_naming_the_file(tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)  # the nested sections are checked on load too
    message = str(caught.value)
    assert expected in message
    assert one_sentence(message), message
    assert str(path) in message  # which file is wrong


def test_invalid_file_is_refused_by_launch_in_one_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("mixed_precision: fp32\nnum_processes: 2\n")
    run = dry_run(tmp_path, "--config_file", str(path))
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "mixed_precision='fp32'" in run.stderr and str(path) in run.stderr


@pytest.mark.parametrize(
    "text, where",
    [
        ("num_processes: 2\nmixed_precision: [bf16\nuse_cpu: true\n", "at line 3 (in what starts at line 2)"),
        ("num_processes: 2\n  mixed_precision: bf16\n", "at line 2;"),
        ("num_processes: 2\nuse_cpu: true\ngpu_ids: '0,1\n", "at line 4 (in what starts at line 3)"),  # open quote
        ("num_processes: 2\n\tuse_cpu: true\n", "at line 2;"),  # a tab
    ],
)
def test_malformed_yaml_names_the_line(tmp_path, text, where):
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert f"is not valid YAML {where}" in message and str(path) in message and one_sentence(message)


def test_non_mapping_and_missing_files(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- num_processes: 2\n")
    with pytest.raises(ConfigError, match="must be a mapping of keys to values, not a list"):
        load_config(path)
    with pytest.raises(ConfigError, match="does not exist; create it with `hasten config`"):
        load_config(tmp_path / "absent.yaml")
    empty = tmp_path / "empty.yaml"
    empty.write_text("\n")
    assert load_config(empty) == LaunchConfig()


# ---------------------------------------------------------------------------- save / JSON / update
def test_save_and_load_round_trip_yaml_and_json(tmp_path):
    config = load_config(DATA / "accelerate_deepspeed_zero3_offload.yaml")
    for name in ("c.yaml", "c.json"):
        path = save_config(config, tmp_path / name)
        assert load_config(path) == config
    assert json.loads((tmp_path / "c.json").read_text())["deepspeed_config"]["zero_stage"] == 3
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic write left nothing behind


def test_save_refuses_an_invalid_config_and_writes_nothing(tmp_path):
    with pytest.raises(ConfigError):
        save_config(LaunchConfig(num_processes=3, num_machines=2, main_process_ip="10.0.0.1"), tmp_path / "c.yaml")
    assert not list(tmp_path.iterdir())


def test_config_update_migrates_an_old_accelerate_file(tmp_path):
    path = tmp_path / "old.yaml"
    shutil.copy(DATA / "accelerate_old_fsdp.yaml", path)
    before = load_config(path)
    result = hasten("config", "update", "--config_file", str(path), env=clean_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "migrated keys:" in result.stdout
    reported = result.stdout.split("migrated keys:", 1)[1]
    for key in ("fp16", "dynamo_backend", "fsdp_config", "mixed_precision", "use_fsdp"):
        assert key in reported, key
    import yaml

    rewritten = yaml.safe_load(path.read_text())
    assert "fp16" not in rewritten and "dynamo_backend" not in rewritten
    assert rewritten["mixed_precision"] == "fp16" and rewritten["dynamo_config"] == {"dynamo_backend": "INDUCTOR"}
    assert rewritten["fsdp_config"]["fsdp_sharding_strategy"] == "SHARD_GRAD_OP"
    assert rewritten["fsdp_config"]["fsdp_backward_prefetch"] == "BACKWARD_POST"
    assert "fsdp_backward_prefetch_policy" not in rewritten["fsdp_config"]
    assert load_config(path) == before  # same meaning, new layout
    again = hasten("config", "update", "--config_file", str(path), env=clean_env(tmp_path))
    assert again.returncode == 0 and "migrated keys" not in again.stdout  # nothing left to migrate


def test_config_update_keeps_json_files_json(tmp_path):
    path = tmp_path / "c.json"
    shutil.copy(DATA / "accelerate_multi_gpu.json", path)
    before = load_config(path)
    result = hasten("config", "update", "--config_file", str(path), env=clean_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert json.loads(path.read_text())["gpu_ids"] == "1,3"
    assert load_config(path) == before


def test_config_update_refuses_a_broken_file_and_leaves_it(tmp_path):
    path = tmp_path / "broken.yaml"
    text = "num_processes: 2\nmixed_precision: [bf16\n"
    path.write_text(text)
    result = hasten("config", "update", "--config_file", str(path), env=clean_env(tmp_path))
    assert result.returncode == 2
    assert "not valid YAML at line 3" in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert path.read_text() == text
    result = hasten("config", "update", "--config_file", str(tmp_path / "absent.yaml"), env=clean_env(tmp_path))
    assert result.returncode == 2 and "does not exist" in result.stderr


# ---------------------------------------------------------------------------- precedence: defaults < file < flags
def test_defaults_without_any_file(tmp_path):
    run = dry_run(tmp_path)
    assert run.returncode == 0, run.stderr
    assert "torch.distributed.run" not in run.argv  # one process: the script runs directly
    assert run.spec["mixed_precision"] == "no" and run.spec["cpu"] is False


def test_file_then_flags(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("distributed_type: MULTI_CPU\nnum_processes: 4\nmixed_precision: bf16\nuse_cpu: true\n")
    from_file = dry_run(tmp_path, "--config_file", str(path))
    assert from_file.returncode == 0, from_file.stderr
    assert from_file.has("--nproc-per-node=4") and from_file.spec["mixed_precision"] == "bf16"
    overridden = dry_run(tmp_path, "--config_file", str(path), "--num_processes", "2")
    assert overridden.returncode == 0, overridden.stderr
    assert overridden.has("--nproc-per-node=2") and not overridden.has("--nproc-per-node=4")
    assert overridden.spec["mixed_precision"] == "bf16" and overridden.spec["cpu"] is True  # the rest from the file
    precision = dry_run(tmp_path, "--config_file", str(path), "--mixed_precision", "fp16")
    assert precision.spec["mixed_precision"] == "fp16" and precision.has("--nproc-per-node=4")


def test_hasten_config_file_env_var_is_the_default_file(tmp_path):
    path = tmp_path / "from_env.yaml"
    path.write_text("distributed_type: MULTI_CPU\nnum_processes: 3\nuse_cpu: true\n")
    run = dry_run(tmp_path, env=clean_env(tmp_path, HASTEN_CONFIG_FILE=str(path)))
    assert run.returncode == 0, run.stderr
    assert run.has("--nproc-per-node=3")
    explicit = tmp_path / "explicit.yaml"
    explicit.write_text("num_processes: 2\n")
    run = dry_run(tmp_path, "--config_file", str(explicit), env=clean_env(tmp_path, HASTEN_CONFIG_FILE=str(path)))
    assert run.has("--nproc-per-node=2")  # --config_file beats the env var


def test_xdg_default_path_is_read(tmp_path):
    default = tmp_path / "xdg" / "hasten" / "default_config.yaml"
    default.parent.mkdir(parents=True)
    default.write_text("num_processes: 2\nmixed_precision: bf16\n")
    run = dry_run(tmp_path)
    assert run.has("--nproc-per-node=2") and run.spec["mixed_precision"] == "bf16"


@pytest.mark.parametrize("flag", ["--no-use_cpu", "--no-cpu", "--no-use-cpu"])
def test_boolean_flag_turns_off_what_the_file_turned_on(tmp_path, flag):
    path = tmp_path / "c.yaml"
    path.write_text("num_processes: 2\nuse_cpu: true\ndebug: true\n")
    assert dry_run(tmp_path, "--config_file", str(path)).spec["cpu"] is True
    run = dry_run(tmp_path, "--config_file", str(path), flag, "--no-debug")
    assert run.returncode == 0, run.stderr
    assert run.spec["cpu"] is False and run.spec["debug"] is False


def test_boolean_flag_turns_on_what_the_file_left_off(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("num_processes: 2\nuse_cpu: false\n")
    assert dry_run(tmp_path, "--config_file", str(path), "--cpu", "--debug").spec == {
        **dry_run(tmp_path, "--config_file", str(path)).spec, "cpu": True, "debug": True}


def test_deepspeed_options_need_use_deepspeed(tmp_path):
    run = dry_run(tmp_path, "--zero_stage", "3")
    assert run.returncode == 2
    assert run.stderr == "hasten launch: error: --zero_stage is a DeepSpeed option; add --use_deepspeed.\n"
    run = dry_run(tmp_path, "--fsdp_sharding_strategy", "NO_SHARD")
    assert run.returncode == 2 and "add --use_fsdp." in run.stderr and run.stderr.count("\n") == 1
    run = dry_run(tmp_path, "--use_deepspeed", "--zero_stage", "3", "--num_processes", "2")
    assert run.returncode == 0, run.stderr
    assert run.spec["deepspeed"]["zero_stage"] == 3


def test_deepspeed_flags_override_single_keys_of_the_file(tmp_path):
    config = DATA / "accelerate_deepspeed_zero3_offload.yaml"
    run = dry_run(tmp_path, "--config_file", str(config), "--zero_stage", "2", "--num_processes", "2")
    assert run.returncode == 0, run.stderr
    ds = run.spec["deepspeed"]
    assert ds["zero_stage"] == 2  # the flag
    assert ds["offload_optimizer_device"] == "cpu" and ds["zero3_init_flag"] is True  # the file
    assert ds["gradient_accumulation_steps"] == 4 and run.has("--nproc-per-node=2")
    assert run.spec["fsdp"] is None and run.spec["mixed_precision"] == "bf16"


def test_fsdp_file_reaches_the_launch_spec(tmp_path):
    run = dry_run(tmp_path, "--config_file", str(DATA / "accelerate_fsdp_transformer_wrap.yaml"))
    assert run.returncode == 0, run.stderr
    assert run.has("--nproc-per-node=4")
    assert run.spec["fsdp"]["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
    assert run.spec["fsdp"]["fsdp_sharding_strategy"] == "SHARD_GRAD_OP" and run.spec["deepspeed"] is None
    off = dry_run(tmp_path, "--config_file", str(DATA / "accelerate_fsdp_transformer_wrap.yaml"), "--no-use_fsdp")
    assert off.returncode == 0, off.stderr
    assert off.spec["fsdp"] is None


def test_machines_from_file_and_per_machine_flag(tmp_path):
    config = DATA / "accelerate_two_machines_c10d.yaml"
    run = dry_run(tmp_path, "--config_file", str(config))
    assert run.returncode == 0, run.stderr
    assert run.has("--nnodes=2", "--nproc-per-node=8", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29501")
    assert run.env.get("CUDA_VISIBLE_DEVICES") is None  # gpu_ids: all
    per_machine = dry_run(tmp_path, "--config_file", str(config), "--num_processes_per_machine", "2")
    assert per_machine.returncode == 0, per_machine.stderr
    assert per_machine.has("--nnodes=2", "--nproc-per-node=2")
    total = dry_run(tmp_path, "--config_file", str(config), "--num_processes", "4")
    assert total.has("--nnodes=2", "--nproc-per-node=2")  # --num_processes is the total
    clash = dry_run(tmp_path, "--config_file", str(config), "--num_processes", "8", "--num_processes_per_machine", "2")
    assert clash.returncode == 2 and "give only one of them." in clash.stderr and clash.stderr.count("\n") == 1
    uneven = dry_run(tmp_path, "--config_file", str(config), "--num_processes", "3")
    assert uneven.returncode == 2 and "not divisible by num_machines 2" in uneven.stderr


def test_gpu_ids_from_file_become_visible_devices(tmp_path):
    run = dry_run(tmp_path, "--config_file", str(DATA / "accelerate_multi_gpu.yaml"))
    assert run.returncode == 0, run.stderr
    assert run.env["CUDA_VISIBLE_DEVICES"] == "0,2" and run.has("--nproc-per-node=2")
    assert run.spec["mixed_precision"] == "fp16" and run.spec["debug"] is True
    run = dry_run(tmp_path, "--config_file", str(DATA / "accelerate_multi_gpu.yaml"), "--gpu_ids", "1,3")
    assert run.env["CUDA_VISIBLE_DEVICES"] == "1,3"
    one = dry_run(tmp_path, "--config_file", str(DATA / "accelerate_multi_gpu.yaml"), "--gpu_ids", "1")
    assert one.returncode == 2 and "names fewer than two GPUs for a run on multiple GPUs" in one.stderr  # Accelerate's


def test_no_mpirun_flag_overrides_an_accelerate_mpirun_file(tmp_path):
    run = dry_run(tmp_path, "--config_file", str(DATA / "accelerate_multi_cpu.yaml"), "--no-mpirun")
    assert run.returncode == 0, run.stderr
    assert run.has("--nproc-per-node=4") and run.spec["cpu"] is True


# ---------------------------------------------------------------------------- the schema itself
# (that every key is a launch flag reaching the config: tests/test_launch_command.py)
def test_schema_defaults_are_valid_and_written_files_hold_only_schema_keys(tmp_path):
    config = LaunchConfig().validate()
    for f in config_fields(LaunchConfig, include_ignored=True):
        choices = f.metadata["choices"]
        if choices:
            assert default_of(f) in choices, f.name
    import yaml

    written = yaml.safe_load(save_config(config, tmp_path / "c.yaml").read_text())
    assert set(written) == {f.name for f in config_fields(LaunchConfig)}  # compatibility keys only when set


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_config_files_keep_the_users_umask(tmp_path, umask, mode):
    """A config file gets the mode every file hasten writes gets (0666 less the umask), not mkstemp's 0600."""
    code = ("import os, sys; os.umask(int(sys.argv[1], 8))\n"
            "from hasten.launch.config import LaunchConfig, save_config\n"
            "from hasten.core.saving import save\n"
            "save_config(LaunchConfig(), sys.argv[2] + '/c.yaml'); save_config(LaunchConfig(), sys.argv[2] + '/c.json')\n"
            "save({'step': 1}, sys.argv[2] + '/state.pt')\n")
    subprocess.run([sys.executable, "-c", code, oct(umask)[2:], str(tmp_path)], check=True)
    modes = {name: (tmp_path / name).stat().st_mode & 0o777 for name in ("c.yaml", "c.json", "state.pt")}
    assert modes == {"c.yaml": mode, "c.json": mode, "state.pt": mode}
