"""`hasten config` driven as a person would: a real pseudo-terminal, typed answers, then the file and the launch.

Each session spawns `python -m hasten config --config_file X` under pexpect.
Numbered menus are used with HASTEN_NO_ARROW_MENU=1; without it the pty is a
real terminal and menus take arrow keys (and digits + Enter).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import signal
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hasten.cli import config_command, prompts
from hasten.launch.config import DeepSpeedConfig, FSDPConfig, LaunchConfig, default_of, load_config
from hasten.process.launch_spec import fp8_problem

pexpect = pytest.importorskip("pexpect")

DOWN, UP, ENTER = "\x1b[B", "\x1b[A", "\r"


def question(name: str, schema: type = LaunchConfig) -> str:
    """The wording of a schema field's question (the questionnaire must ask exactly this)."""
    return schema.__dataclass_fields__[name].metadata["question"]


def clean_env(tmp_path: Path, arrows: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("HASTEN_CONFIG_FILE", "HASTEN_LAUNCH_SPEC", "HASTEN_NO_ARROW_MENU")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "xdg"), TERM="xterm", PYTHONUNBUFFERED="1")
    if not arrows:
        env["HASTEN_NO_ARROW_MENU"] = "1"
    return env


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Session:
    """One `hasten config` run in a pseudo-terminal."""

    def __init__(self, tmp_path: Path, path: Path, arrows: bool = False):
        self.transcript = io.StringIO()
        # SIGINT back to its default: a test run started in the background (`cmd &`) inherits it
        # ignored, and then the ^C sent through the terminal would reach nobody.
        self.child = pexpect.spawn(sys.executable, ["-m", "hasten", "config", "--config_file", str(path)],
                                   env=clean_env(tmp_path, arrows), encoding="utf-8", timeout=30,
                                   dimensions=(60, 200), preexec_fn=_default_sigint)
        self.child.logfile_read = self.transcript

    def _expect(self, pattern: str) -> re.Match:
        try:
            self.child.expect(pattern)
        except (pexpect.TIMEOUT, pexpect.EOF):
            pytest.fail(f"expected {pattern!r}; the terminal showed:\n{self.transcript.getvalue()[-3000:]}")
        return self.child.match

    def answer(self, text: str, reply: str, default: str | None = None) -> None:
        """A question answered by typing a line; checks the default shown in brackets."""
        match = self._expect(re.escape(text) + r"[^\n]*? \[([^\]\n]*)\]: ")
        if default is not None:
            assert match.group(1) == default, f"{text}: default shown [{match.group(1)}], expected [{default}]"
        self.child.send(reply + ENTER)

    def menu(self, text: str, reply: str, default: str | None = None) -> None:
        """A numbered menu (no arrow keys)."""
        self._expect(re.escape(text) + r"\r?\n")
        self.answer("Your choice", reply, default)

    def arrow_menu(self, text: str, *keys: str, last_label: str, picked: str | None = None) -> None:
        """An arrow-key menu: wait until it is drawn (the terminal is then in cbreak mode), press keys."""
        self._expect(re.escape(text) + r"  \(arrow keys or a number, Enter to choose\)")
        self._expect(re.escape(last_label))
        for key in keys[:-1]:
            self.child.send(key)
        if picked is not None:  # the marker moved to the expected item before Enter
            self._expect(r"> " + re.escape(picked))
        self.child.send(keys[-1])

    def expect(self, pattern: str) -> None:
        self._expect(pattern)

    def ctrl_c(self) -> None:
        """Press Ctrl-C at the question on screen.

        The pause is a person's reaction time; without it the signal can land
        between the prompt being printed and the read starting, where Python
        only notices it once the read returns.
        """
        time.sleep(0.5)
        self.child.sendintr()

    def finish(self) -> int:
        self._expect(pexpect.EOF)
        self.child.close()
        return self.child.exitstatus

    @property
    def text(self) -> str:
        return self.transcript.getvalue()


def dry_run(tmp_path: Path, config: Path, *flags: str) -> tuple[dict[str, str], list[str], dict]:
    """`hasten launch --config_file config --dry_run train.py`: (env assignments, argv, launch spec)."""
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("HASTEN_CONFIG_FILE", "HASTEN_LAUNCH_SPEC")}
    result = subprocess.run([sys.executable, "-m", "hasten", "launch", "--config_file", str(config), "--dry_run",
                             *flags, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    tokens = shlex.split(result.stdout.strip())
    assignments = {}
    while "=" in tokens[0] and not tokens[0].startswith("/"):
        key, value = tokens.pop(0).split("=", 1)
        assignments[key] = value
    return assignments, tokens, json.loads(assignments["HASTEN_LAUNCH_SPEC"])


# ---------------------------------------------------------------------------- answer paths
def test_multi_cpu_two_processes_with_numbers(tmp_path):
    path = tmp_path / "cfg" / "multi_cpu.yaml"  # the folder does not exist yet
    s = Session(tmp_path, path)
    s.menu(question("compute_environment"), "1", default="1")
    s.menu(question("distributed_type"), "2", default="1")
    s.answer(question("num_machines"), "1", default="1")
    s.answer(question("mpirun"), "no", default="no")
    s.answer(question("num_processes"), "2", default="2")
    s.menu(question("mixed_precision"), "3", default="1")
    s.answer(question("debug"), "yes", default="no")
    assert s.finish() == 0, s.text
    assert f"wrote {path}" in s.text
    config = load_config(path)
    assert (config.distributed_type, config.num_processes, config.num_machines) == ("MULTI_CPU", 2, 1)
    assert config.use_cpu is True and config.mixed_precision == "bf16" and config.debug is True
    assert config.mpirun is False and config.use_deepspeed is False and config.use_fsdp is False
    env, argv, spec = dry_run(tmp_path, path)
    assert "--nproc-per-node=2" in argv and "--nnodes=1" in argv
    assert spec["cpu"] is True and spec["mixed_precision"] == "bf16" and spec["debug"] is True


def test_multi_gpu_deepspeed_zero3_cpu_offload_with_arrow_menus(tmp_path):
    """Arrow-key menus answered the numbered-menu way: a digit, then Enter."""
    path = tmp_path / "ds.yaml"
    s = Session(tmp_path, path, arrows=True)
    s.arrow_menu(question("compute_environment"), ENTER, last_label="2) A cluster")
    s.arrow_menu(question("distributed_type"), "3", ENTER, last_label="4) TPU", picked="3) multi-GPU")
    s.answer(question("num_machines"), "", default="1")
    s.answer(question("use_deepspeed"), "yes", default="no")
    s.answer(question("deepspeed_config_file", DeepSpeedConfig), "", default="")
    s.arrow_menu(question("zero_stage", DeepSpeedConfig), "4", ENTER, last_label="4) 3", picked="4) 3")
    s.arrow_menu(question("offload_optimizer_device", DeepSpeedConfig), "2", ENTER, last_label="3) nvme",
                 picked="2) cpu")
    s.arrow_menu(question("offload_param_device", DeepSpeedConfig), DOWN, ENTER, last_label="3) nvme",
                 picked="2) cpu")
    s.answer(question("num_processes"), "4")
    s.answer(question("gpu_ids"), "0,1,2,3", default="all")
    s.arrow_menu(question("mixed_precision"), "3", ENTER, last_label="3) bf16", picked="3) bf16")
    s.answer(question("debug"), "")
    assert s.finish() == 0, s.text
    config = load_config(path)
    assert config.distributed_type == "DEEPSPEED" and config.use_deepspeed and not config.use_fsdp
    ds = config.deepspeed
    assert (ds.zero_stage, ds.offload_optimizer_device, ds.offload_param_device) == (3, "cpu", "cpu")
    assert ds.deepspeed_config_file is None
    assert config.num_processes == 4 and config.gpu_ids == "0,1,2,3" and config.mixed_precision == "bf16"
    assert config.use_cpu is False and config.compute_environment == "LOCAL_MACHINE"
    env, argv, spec = dry_run(tmp_path, path)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and "--nproc-per-node=4" in argv
    assert spec["deepspeed"]["zero_stage"] == 3 and spec["deepspeed"]["offload_param_device"] == "cpu"
    assert spec["fsdp"] is None and spec["mixed_precision"] == "bf16"


def test_multi_gpu_fsdp_with_numbers(tmp_path):
    path = tmp_path / "fsdp.yaml"
    s = Session(tmp_path, path)
    s.menu(question("compute_environment"), "")
    s.menu(question("distributed_type"), "3")
    s.answer(question("num_machines"), "")
    s.answer(question("use_deepspeed"), "n")
    s.answer(question("use_fsdp"), "y", default="no")
    s.menu(question("fsdp_sharding_strategy", FSDPConfig), "2", default="1")
    s.menu(question("fsdp_auto_wrap_policy", FSDPConfig), "2", default="1")
    s.menu(question("fsdp_state_dict_type", FSDPConfig), "1", default="2")
    s.answer(question("num_processes"), "2")
    s.answer(question("gpu_ids"), "")
    s.menu(question("mixed_precision"), "fp16")  # the value itself is accepted too
    s.answer(question("debug"), "no")
    assert s.finish() == 0, s.text
    config = load_config(path)
    assert config.distributed_type == "FSDP" and config.use_fsdp and not config.use_deepspeed
    fsdp = config.fsdp
    assert fsdp.fsdp_sharding_strategy == "SHARD_GRAD_OP"
    assert fsdp.fsdp_auto_wrap_policy == "SIZE_BASED_WRAP"
    assert fsdp.fsdp_state_dict_type == "FULL_STATE_DICT"
    assert config.num_processes == 2 and config.gpu_ids == "all" and config.mixed_precision == "fp16"
    env, argv, spec = dry_run(tmp_path, path)
    assert "--nproc-per-node=2" in argv and "CUDA_VISIBLE_DEVICES" not in env
    assert spec["fsdp"]["fsdp_sharding_strategy"] == "SHARD_GRAD_OP" and spec["deepspeed"] is None


def test_two_machines_c10d_with_every_bad_answer_reasked(tmp_path):
    path = tmp_path / "two.yaml"
    s = Session(tmp_path, path)
    s.menu(question("compute_environment"), "2")
    s.menu(question("distributed_type"), "2")
    s.answer(question("num_machines"), "abc", default="1")
    s.expect(r"'abc' is not a whole number\. Please try again\.")
    s.answer(question("num_machines"), "0")
    s.expect(r"0 is below the minimum 1\.")
    s.answer(question("num_machines"), "2")
    s.answer(question("machine_rank"), "2", default="0")
    s.expect(r"2 is above the maximum 1\.")
    s.answer(question("machine_rank"), "1")
    s.answer(question("main_process_ip"), "", default="")
    s.expect(r"an address is needed\.")
    s.answer(question("main_process_ip"), "10.1.2.3")
    s.answer(question("main_process_port"), "70000", default="29500")
    s.expect(r"70000 is above the maximum 65535\.")
    s.answer(question("main_process_port"), "29555")
    s.menu(question("rdzv_backend"), "2", default="1")
    s.answer(question("same_network"), "maybe", default="yes")
    s.expect(r"'maybe' is not yes or no\.")
    s.answer(question("same_network"), "no")
    s.answer(question("mpirun"), "")
    s.answer(question("num_processes"), "3", default="4")  # 2 per machine by default
    s.expect(r"3 processes cannot be split evenly over 2 machines\.")
    s.answer(question("num_processes"), "4")
    s.menu(question("mixed_precision"), "")
    s.answer(question("debug"), "")
    assert s.finish() == 0, s.text
    config = load_config(path)
    assert config.compute_environment == "CLUSTER" and config.distributed_type == "MULTI_CPU"
    assert (config.num_machines, config.machine_rank, config.num_processes) == (2, 1, 4)
    assert (config.main_process_ip, config.main_process_port, config.rdzv_backend) == ("10.1.2.3", 29555, "c10d")
    assert config.same_network is False and config.use_cpu is True
    env, argv, spec = dry_run(tmp_path, path)
    for flag in ("--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=10.1.2.3:29555"):
        assert flag in argv, (flag, argv)
    assert spec["cpu"] is True


def test_bad_menu_number_and_tpu_are_reasked(tmp_path):
    path = tmp_path / "one.yaml"
    s = Session(tmp_path, path)
    s.menu(question("compute_environment"), "")
    s.menu(question("distributed_type"), "7", default="1")
    s.expect(r"'7' is not one of the numbers 1-4\. Please try again\.")
    s.answer("Your choice", "4")
    s.expect(r"hasten does not support TPUs; choose another machine type\.")
    s.menu(question("distributed_type"), "multi-CPU")  # a label is accepted too
    s.answer(question("num_machines"), "")
    s.answer(question("mpirun"), "")
    s.answer(question("num_processes"), "x")
    s.expect(r"'x' is not a whole number\.")
    s.answer(question("num_processes"), "")  # the default [2]
    s.menu(question("mixed_precision"), "0")
    s.expect(rf"'0' is not one of the numbers 1-{3 if fp8_problem() else 4}\.")  # fp8 is offered with torchao
    s.answer("Your choice", "")
    s.answer(question("debug"), "")
    assert s.finish() == 0, s.text
    config = load_config(path)
    assert (config.distributed_type, config.num_processes, config.mixed_precision) == ("MULTI_CPU", 2, "no")


def test_enter_everywhere_takes_the_defaults(tmp_path):
    path = tmp_path / "defaults.yaml"
    s = Session(tmp_path, path)
    s.menu(question("compute_environment"), "", default="1")
    s.menu(question("distributed_type"), "", default="1")
    s.answer(question("use_cpu"), "", default="yes")  # this machine has no GPU
    s.menu(question("mixed_precision"), "", default="1")
    assert s.finish() == 0, s.text
    assert question("num_processes") not in s.text  # one process: not asked
    config = load_config(path)
    assert config == LaunchConfig(use_cpu=True)


def test_existing_file_supplies_the_defaults(tmp_path):
    path = tmp_path / "existing.yaml"
    path.write_text("distributed_type: MULTI_CPU\nnum_processes: 3\nmixed_precision: bf16\nuse_cpu: true\n"
                    "debug: true\n")
    before = load_config(path)
    s = Session(tmp_path, path)
    s.menu(question("compute_environment"), "", default="1")
    s.menu(question("distributed_type"), "", default="2")
    s.answer(question("num_machines"), "", default="1")
    s.answer(question("mpirun"), "", default="no")
    s.answer(question("num_processes"), "", default="3")
    s.menu(question("mixed_precision"), "", default="3")
    s.answer(question("debug"), "", default="yes")
    assert s.finish() == 0, s.text
    assert load_config(path) == before


def test_deepspeed_file_offers_multi_gpu_and_its_stage_as_defaults(tmp_path):
    path = tmp_path / "ds.yaml"
    path.write_text((Path(__file__).parent / "data" / "accelerate_deepspeed_zero3_offload.yaml").read_text())
    s = Session(tmp_path, path)
    s.menu(question("compute_environment"), "")
    s.menu(question("distributed_type"), "", default="3")
    s.answer(question("num_machines"), "")
    s.answer(question("use_deepspeed"), "", default="yes")
    s.answer(question("deepspeed_config_file", DeepSpeedConfig), "")
    s.menu(question("zero_stage", DeepSpeedConfig), "", default="4")
    s.menu(question("offload_optimizer_device", DeepSpeedConfig), "", default="2")
    s.menu(question("offload_param_device", DeepSpeedConfig), "", default="2")
    s.answer(question("num_processes"), "", default="8")
    before = path.read_text()
    s.ctrl_c()  # and leave the file as it was
    assert s.finish() == 130
    assert path.read_text() == before


def test_arrow_keys_pick_items_and_tpu_is_refused(tmp_path):
    path = tmp_path / "arrows.yaml"
    s = Session(tmp_path, path, arrows=True)
    s.arrow_menu(question("compute_environment"), DOWN, ENTER, last_label="2) A cluster",
                 picked="2) A cluster")
    s.arrow_menu(question("distributed_type"), "4", ENTER, last_label="4) TPU", picked="4) TPU")
    s.expect(r"hasten does not support TPUs; choose another machine type\.")
    s.arrow_menu(question("distributed_type"), "7", DOWN, ENTER, last_label="4) TPU", picked="2) multi-CPU")
    s.answer(question("num_machines"), "", default="1")
    s.answer(question("mpirun"), "")
    s.answer(question("num_processes"), "2")
    s.arrow_menu(question("mixed_precision"), DOWN, DOWN, UP, ENTER, last_label="3) bf16", picked="2) fp16")
    s.answer(question("debug"), "")
    assert s.finish() == 0, s.text
    assert "\a" in s.text  # "7" in a 4-item menu beeped instead of being taken
    config = load_config(path)
    assert config.compute_environment == "CLUSTER" and config.distributed_type == "MULTI_CPU"
    assert config.mixed_precision == "fp16" and config.num_processes == 2
    env, argv, spec = dry_run(tmp_path, path)
    assert "--nproc-per-node=2" in argv and spec["mixed_precision"] == "fp16"


# ---------------------------------------------------------------------------- Ctrl-C / end of input
def test_ctrl_c_midway_writes_no_file(tmp_path):
    path = tmp_path / "never.yaml"
    s = Session(tmp_path, path)
    s.menu(question("compute_environment"), "1")
    s.menu(question("distributed_type"), "2")
    s.answer(question("num_machines"), "1")
    s.expect(re.escape(question("mpirun")))
    s.ctrl_c()
    assert s.finish() == 130
    assert "aborted; no file was written" in s.text
    assert not path.exists() and list(tmp_path.iterdir()) == []  # no file, no temporary file


def test_ctrl_c_in_an_arrow_menu_keeps_the_existing_file(tmp_path):
    path = tmp_path / "keep.yaml"
    original = "# my settings\ndistributed_type: MULTI_CPU\nnum_processes: 2\nuse_cpu: true\n"
    path.write_text(original)
    s = Session(tmp_path, path, arrows=True)
    s.arrow_menu(question("compute_environment"), ENTER, last_label="2) A cluster")
    s.expect(r"4\) TPU")
    s.ctrl_c()  # while the terminal is in cbreak mode
    assert s.finish() == 130
    assert path.read_text() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.yaml"]  # no temporary file left


def test_end_of_input_aborts_too(tmp_path):
    path = tmp_path / "eof.yaml"
    s = Session(tmp_path, path)
    s.menu(question("compute_environment"), "")
    s.expect(r"Your choice \[1\]: ")
    s.child.sendeof()
    assert s.finish() == 130 and not path.exists()


def test_answers_can_be_piped(tmp_path):
    """Not a terminal: numbered menus, answers from stdin (scripts, CI)."""
    path = tmp_path / "piped.yaml"
    env = clean_env(tmp_path, arrows=True)
    result = subprocess.run([sys.executable, "-m", "hasten", "config", "--config_file", str(path)],
                            input="\n2\n\n\n3\n2\nno\n", capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "arrow keys" not in result.stdout and "1) No distributed training" in result.stdout
    config = load_config(path)
    assert (config.distributed_type, config.num_processes, config.mixed_precision) == ("MULTI_CPU", 3, "fp16")


# ---------------------------------------------------------------------------- every question comes from the schema
SCHEMAS = (LaunchConfig, DeepSpeedConfig, FSDPConfig)
BY_QUESTION = {f.metadata["question"]: (schema, f)
               for schema in SCHEMAS for f in dataclasses.fields(schema) if f.metadata.get("question")}

# Defaults the questionnaire derives instead of copying the schema's (and why).
DERIVED_DEFAULTS = {
    "num_processes": "one process per GPU (2 per machine without GPUs) once the run is distributed",
    "main_process_port": "several machines need a fixed port: 29500 instead of 'a free one'",
}

# Paths through the questionnaire: field -> answer (anything not listed takes the offered default).
PATHS = {
    "two machines, mpirun": {"compute_environment": "CLUSTER", "distributed_type": "MULTI_CPU", "num_machines": 2,
                             "main_process_ip": "10.0.0.1", "mpirun": True, "mpirun_hostfile": "/etc/hosts"},
    "multi-GPU DeepSpeed": {"distributed_type": "MULTI_GPU", "num_machines": 1, "use_deepspeed": True,
                            "deepspeed_config_file": "", "zero_stage": 3},
    "multi-GPU FSDP": {"distributed_type": "MULTI_GPU", "num_machines": 1, "use_deepspeed": False, "use_fsdp": True},
    "one process": {"distributed_type": "NO"},
}


def walk(monkeypatch, answers: dict[str, Any], defaults: LaunchConfig | None) -> tuple[LaunchConfig, list[tuple]]:
    """Run the questionnaire with recording prompts: [(field, schema, offered default, offered choices)]."""
    asked: list[tuple] = []

    def record(text: str, default: Any, choices: Any = None) -> Any:
        assert text in BY_QUESTION, f"question not worded by the schema: {text!r}"
        schema, f = BY_QUESTION[text]
        asked.append((f.name, schema, default, tuple(choices) if choices is not None else None))
        return answers.get(f.name, default)

    monkeypatch.setattr(prompts, "ask_choice", lambda q, choices, default, labels=None: record(q, default, choices))
    monkeypatch.setattr(prompts, "ask_int", lambda q, default, minimum=None, maximum=None: record(q, default))
    monkeypatch.setattr(prompts, "ask_bool", lambda q, default=False: record(q, default))
    monkeypatch.setattr(prompts, "ask_text", lambda q, default=None: record(q, default))
    monkeypatch.setattr(prompts, "ask", lambda q, parse, default, shown_default=None: record(q, default))
    return config_command.ask_answers(defaults, gpus=2), asked


def _schema_value(source: LaunchConfig, schema: type, name: str) -> Any:
    holder = source if schema is LaunchConfig else (source.deepspeed if schema is DeepSpeedConfig else source.fsdp)
    return getattr(holder, name)


@pytest.mark.parametrize("path_name", sorted(PATHS))
def test_fresh_questionnaire_offers_the_schema_defaults(monkeypatch, path_name):
    config, asked = walk(monkeypatch, PATHS[path_name], defaults=None)
    assert asked
    for name, schema, offered, choices in asked:
        f = schema.__dataclass_fields__[name]
        if choices is not None and name not in ("compute_environment", "distributed_type"):
            # fp8 without a backend is refused at launch, so it is offered only where torchao/TE is installed
            refused = {"fp8"} if name == "mixed_precision" and fp8_problem() else set()
            expected = tuple(c for c in f.metadata["choices"] if c not in refused)
            assert choices == expected, f"{name}: menu differs from the schema's choices"
        if name in DERIVED_DEFAULTS:
            continue
        expected = default_of(f)
        assert (offered or None) == (expected or None) if isinstance(expected, (str, type(None))) else \
            offered == expected, f"{name}: offered default {offered!r}, schema default {expected!r}"
    expected_type = {"multi-GPU DeepSpeed": "DEEPSPEED", "multi-GPU FSDP": "FSDP"}  # as Accelerate writes them
    for key, value in PATHS[path_name].items():
        if key == "distributed_type":
            value = expected_type.get(path_name, value)
        if key in LaunchConfig.__dataclass_fields__:
            assert getattr(config, key) == value, key


# A previous file in which every asked setting differs from the schema default.
PREVIOUS = LaunchConfig(
    compute_environment="CLUSTER", distributed_type="MULTI_CPU", num_machines=3, machine_rank=2,
    main_process_ip="10.9.8.7", main_process_port=1234, rdzv_backend="c10d", same_network=False, num_processes=6,
    gpu_ids="1,2", use_cpu=True, mixed_precision="bf16", debug=True, mpirun=True, mpirun_hostfile="/h",
    use_deepspeed=True, use_fsdp=True,
    deepspeed_config={"deepspeed_config_file": "ds.json", "zero_stage": 1, "offload_optimizer_device": "nvme",
                      "offload_param_device": "cpu"},
    fsdp_config={"fsdp_sharding_strategy": "NO_SHARD", "fsdp_auto_wrap_policy": "NO_WRAP",
                 "fsdp_state_dict_type": "FULL_STATE_DICT"},
)


@pytest.mark.parametrize("path_name", sorted(PATHS))
def test_previous_file_supplies_every_offered_default(monkeypatch, path_name):
    answers = dict(PATHS[path_name])
    for key in ("compute_environment", "num_machines", "mpirun_hostfile", "deepspeed_config_file", "zero_stage"):
        answers.pop(key, None)  # take the previous file's answer
    _, asked = walk(monkeypatch, answers, defaults=PREVIOUS)
    for name, schema, offered, _ in asked:
        expected = _schema_value(PREVIOUS, schema, name)
        assert offered == expected, f"{name}: offered {offered!r}, the previous file says {expected!r}"


def test_every_schema_question_is_asked_on_some_path(monkeypatch):
    seen = set()
    for answers in PATHS.values():
        seen |= {(schema.__name__, name) for name, schema, _, _ in walk(monkeypatch, answers, defaults=None)[1]}
    expected = {(schema.__name__, f.name) for schema, f in BY_QUESTION.values()}
    assert seen == expected
