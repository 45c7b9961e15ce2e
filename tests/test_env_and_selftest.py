"""`hasten config default`, `hasten env` and `hasten test`, run as commands."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

import hasten
from hasten.cli.config_command import default_config
from hasten.launch.config import LaunchConfig, load_config

DATA = Path(__file__).parent / "data"


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HASTEN_CONFIG_FILE", "HASTEN_LAUNCH_SPEC")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def hasten_cmd(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    process = subprocess.Popen([sys.executable, "-m", "hasten", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        stdout, stderr = process.communicate()
        pytest.fail(f"hasten {' '.join(args)} timed out\nstdout:\n{stdout}\nstderr:\n{stderr}")
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)


# ---------------------------------------------------------------------------- hasten config default
def test_config_default_writes_refuses_to_overwrite_and_forces(tmp_path):
    path = tmp_path / "sub" / "c.yaml"
    env = clean_env(tmp_path)
    first = hasten_cmd("config", "default", "--config_file", str(path), env=env)
    assert first.returncode == 0, first.stderr
    assert f"wrote {path}" in first.stdout and "0 GPU(s)" in first.stdout
    config = load_config(path)
    assert config == LaunchConfig(use_cpu=True)  # no GPU here: one process on the CPU
    text = path.read_text()
    again = hasten_cmd("config", "default", "--config_file", str(path), "--mixed_precision", "bf16", env=env)
    assert again.returncode == 2
    assert again.stderr == f"hasten config: error: {path} already exists; pass --force to overwrite it.\n"
    assert path.read_text() == text
    forced = hasten_cmd("config", "--config_file", str(path), "default", "--mixed_precision", "bf16", "--force",
                        env=env)
    assert forced.returncode == 0, forced.stderr
    assert load_config(path).mixed_precision == "bf16"


def test_config_default_follows_the_env_var_and_xdg(tmp_path, monkeypatch, capsys):
    """In-process (the same `main()` the command runs) to keep the suite fast."""
    from hasten.cli.main import main

    target = tmp_path / "from_env.yaml"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HASTEN_CONFIG_FILE", str(target))
    assert main(["config", "default"]) == 0
    assert target.exists() and not (tmp_path / "xdg").exists()
    monkeypatch.delenv("HASTEN_CONFIG_FILE")
    assert main(["config", "default"]) == 0
    assert (tmp_path / "xdg" / "hasten" / "default_config.yaml").exists()
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["config", "--help"])
    help_text = capsys.readouterr().out
    assert str(tmp_path / "xdg" / "hasten" / "default_config.yaml") in help_text and "HASTEN_CONFIG_FILE" in help_text


@pytest.mark.parametrize("gpus, expected", [
    (0, dict(distributed_type="NO", num_processes=1, use_cpu=True)),
    (1, dict(distributed_type="NO", num_processes=1, use_cpu=False)),
    (4, dict(distributed_type="MULTI_GPU", num_processes=4, use_cpu=False)),
])
def test_default_config_matches_the_hardware(gpus, expected):
    config = default_config(gpus, "fp16")
    assert {key: getattr(config, key) for key in expected} == expected and config.mixed_precision == "fp16"


# ---------------------------------------------------------------------------- hasten env
def test_env_prints_the_facts(tmp_path):
    import torch

    config = DATA / "accelerate_two_machines_c10d.yaml"
    result = hasten_cmd("env", "--config_file", str(config), env=clean_env(tmp_path))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    facts = [
        f"- hasten: {hasten.__version__}",
        f"- Python: {platform.python_version()}",
        f"- torch: {torch.__version__}",
        f"- CUDA available: {torch.cuda.is_available()}",
        f"- platform: {platform.platform()}",
        f"- CPU cores (usable): {len(os.sched_getaffinity(0))}",
        "- RAM: ",
        "- GPUs: []" if not torch.cuda.is_available() else "- GPUs: [",
        "- integrations:",
        "    pyyaml: ",
        f"- config file: {config}",
        "    num_machines: 2",
        "    rdzv_backend: c10d",
        "    main_process_ip: 10.0.0.1",
    ]
    for fact in facts:
        assert fact in out, f"missing {fact!r} in:\n{out}"
    ram = out.split("- RAM: ", 1)[1].split("\n", 1)[0]
    assert ram.endswith(" GiB") and float(ram.split()[0]) > 0


def test_env_without_a_file_and_with_a_broken_one(tmp_path, monkeypatch, capsys, no_fp8_backend):
    from hasten.cli.main import main

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("HASTEN_CONFIG_FILE", raising=False)
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "(absent: defaults used)" in out and "    num_processes: 1" in out
    broken = tmp_path / "broken.yaml"
    broken.write_text("num_processes: 2\nmixed_precision: fp8\n")
    monkeypatch.setenv("HASTEN_CONFIG_FILE", str(broken))
    assert main(["env"]) == 0  # a bug report must still be possible
    out = capsys.readouterr().out
    assert f"- config file: {broken}" in out
    assert "- config: unreadable:" in out and "mixed_precision='fp8'" in out


# ---------------------------------------------------------------------------- hasten test
def test_selftest_passes_on_two_cpu_processes(tmp_path):
    result = hasten_cmd("test", "--num_processes", "2", "--cpu", env=clean_env(tmp_path), timeout=150)
    assert result.returncode == 0, result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("hasten test: passed — 7 checks on 2 process(es)"), result.stdout
    assert "device cpu" in last
    assert result.stdout.count("hasten test:") == 1  # one line, from the main process only


def test_selftest_reports_the_failing_check_and_rank(tmp_path):
    """The FAILED path of the same self-test: one extra check (added by a wrapper script) fails on rank 1.

    No test-only hook in the product: the wrapper registers a check with the
    self-test's own `check` decorator and runs its `main()` under `hasten launch`.
    """
    wrapper = tmp_path / "broken_selftest.py"
    wrapper.write_text(
        "from hasten.cli import selftest\n\n"
        "@selftest.check('deliberately broken')\n"
        "def _broken(acc):\n"
        "    assert acc.process_index != 1, 'rank 1 disagrees'\n\n"
        "raise SystemExit(selftest.main())\n"
    )
    result = hasten_cmd("launch", "--num_processes", "2", "--cpu", str(wrapper), env=clean_env(tmp_path), timeout=150)
    assert result.returncode != 0
    lines = [line for line in result.stdout.splitlines() if line.startswith("hasten test:")]
    assert len(lines) == 1, result.stdout + result.stderr
    assert lines[0].startswith("hasten test: FAILED — check 'deliberately broken' on rank 1: "
                               "AssertionError: rank 1 disagrees (1 failure(s); 2 process(es)"), lines[0]
