"""`hasten to-fsdp2` converts an FSDP1 config file as `accelerate to-fsdp2` does, and `hasten launch` takes the result."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hasten.cli.main import main

FSDP1 = {
    "compute_environment": "LOCAL_MACHINE",
    "distributed_type": "FSDP",
    "mixed_precision": "no",
    "num_machines": 1,
    "num_processes": 2,
    "use_cpu": True,
    "fsdp_config": {
        "fsdp_version": 1,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": "GPT2Block",
        "fsdp_backward_prefetch": "BACKWARD_PRE",
        "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_forward_prefetch": False,
        "fsdp_offload_params": False,
        "fsdp_sharding_strategy": "SHARD_GRAD_OP",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_sync_module_states": True,
        "fsdp_use_orig_params": True,
        "fsdp_activation_checkpointing": False,
    },
}


def _write(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


def test_conversion_equals_accelerates_and_launch_accepts_it(tmp_path, capsys):
    source = _write(tmp_path / "fsdp1.yaml", FSDP1)
    assert main(["to-fsdp2", "--config_file", str(source), "--output_file", str(tmp_path / "hasten.yaml")]) == 0
    warnings = capsys.readouterr().err
    for dropped in ("fsdp_backward_prefetch", "fsdp_forward_prefetch", "fsdp_sync_module_states", "fsdp_use_orig_params"):
        assert f"warning: {dropped} " in warnings
    peer = subprocess.run([sys.executable, "-m", "accelerate.commands.accelerate_cli", "to-fsdp2", "--config_file",
                           str(source), "--output_file", str(tmp_path / "peer.yaml")], capture_output=True, text=True,
                          timeout=120)
    assert peer.returncode == 0, peer.stderr
    ours = yaml.safe_load((tmp_path / "hasten.yaml").read_text())
    assert ours == yaml.safe_load((tmp_path / "peer.yaml").read_text())
    assert (tmp_path / "hasten.yaml").read_text() == (tmp_path / "peer.yaml").read_text()  # the same file, byte for byte
    assert ours["fsdp_config"]["fsdp_reshard_after_forward"] is False and ours["fsdp_config"]["fsdp_version"] == 2
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    capsys.readouterr()
    assert main(["launch", "--config_file", str(tmp_path / "hasten.yaml"), "--dry_run", str(script)]) == 0
    spec = capsys.readouterr().out
    assert '"fsdp_version": 2' in spec and '"fsdp_reshard_after_forward": false' in spec and "--nproc-per-node=2" in spec


def test_overwrite_in_place_and_old_numeric_strategy(tmp_path):
    old = {"distributed_type": "FSDP", "fsdp_config": {"fsdp_sharding_strategy": 1, "fsdp_offload_params": True}}
    path = _write(tmp_path / "old.yaml", old)
    assert main(["to-fsdp2", "--config_file", str(path), "--overwrite"]) == 0
    assert yaml.safe_load(path.read_text())["fsdp_config"] == {"fsdp_offload_params": True,
                                                               "fsdp_reshard_after_forward": True, "fsdp_version": 2}


def test_errors_are_one_sentence(tmp_path, capsys):
    def error(*argv: str) -> str:
        with pytest.raises(SystemExit) as exited:
            main(["to-fsdp2", *argv])
        assert exited.value.code == 2
        message = capsys.readouterr().err.strip()
        assert message.count("\n") == 0
        return message

    assert "missing.yaml not found; pass the path" in error("--config_file", str(tmp_path / "missing.yaml"), "--overwrite")
    source = _write(tmp_path / "fsdp1.yaml", FSDP1)
    assert "--output_file PATH" in error("--config_file", str(source))
    taken = _write(tmp_path / "taken.yaml", {})
    assert "taken.yaml already exists; pass --overwrite" in error("--config_file", str(source), "--output_file", str(taken))
    assert "is empty" in error("--config_file", str(taken), "--output_file", str(tmp_path / "out.yaml"))
    fsdp2 = _write(tmp_path / "fsdp2.yaml", {"fsdp_config": {"fsdp_version": 2, "fsdp_reshard_after_forward": True}})
    assert main(["to-fsdp2", "--config_file", str(fsdp2), "--output_file", str(tmp_path / "same.yaml")]) == 0
    assert "already specifies FSDP2" in capsys.readouterr().err  # a warning, as the peer: the file is written unchanged
    assert yaml.safe_load((tmp_path / "same.yaml").read_text()) == yaml.safe_load(fsdp2.read_text())
