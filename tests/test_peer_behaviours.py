"""Behaviours a script written for Accelerate observes, pinned to what Accelerate 1.16 does.

Measured against the peer on this machine (2 CPU processes): `PartialState().distributed_type`
is NO on one process and MULTI_CPU on several before any Accelerator, and afterwards what the
Accelerator chose; `accelerate launch` exports ACCELERATE_MIXED_PRECISION, ACCELERATE_USE_CPU,
ACCELERATE_DYNAMO_* next to torchrun's variables; torchrun's restarts count in
TORCHELASTIC_RESTART_COUNT.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

import hasten
from hasten import Accelerator, DistributedType, PartialState
from hasten.process.launch_spec import LaunchSpec
from hasten.state import AcceleratorState
from hasten.utils import PrecisionType, RNGType, DynamoBackend, tqdm
from hasten.utils.operations import copy_tensor_to_devices

from conftest import launch


@pytest.fixture(autouse=True)
def _fresh_state():
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def test_version_passes_the_checks_scripts_make_against_accelerate():
    from packaging import version

    assert version.parse(hasten.__version__) >= version.parse("0.16.0")  # diffusers' checkpoint-hook gate
    assert hasten.__version__.startswith("1.16.")  # major.minor = the Accelerate API implemented


def test_partial_state_reports_the_distributed_type_before_and_after_an_accelerator():
    assert PartialState(cpu=True).distributed_type == DistributedType.NO
    accelerator = Accelerator(cpu=True)
    accelerator.state.distributed_type = DistributedType.FSDP  # settable, as the peer's attribute
    assert accelerator.state.distributed_type == DistributedType.FSDP == AcceleratorState().distributed_type
    assert PartialState().distributed_type == DistributedType.NO  # the peer keeps the two levels apart
    PartialState().distributed_type = DistributedType.MULTI_CPU
    assert PartialState().distributed_type == DistributedType.MULTI_CPU
    PartialState._reset_state()
    assert PartialState().distributed_type == DistributedType.NO


def test_an_accelerator_state_refuses_use_after_reset_until_a_new_accelerator_exists():
    accelerator = Accelerator(cpu=True)
    AcceleratorState._reset_state()
    with pytest.raises(AttributeError) as caught:
        accelerator.prepare(torch.nn.Linear(1, 1))
    # the peer's own test matches these two phrases
    assert "`AcceleratorState` object has no attribute" in str(caught.value)
    assert "This happens if `AcceleratorState._reset_state()`" in str(caught.value)
    assert accelerator.is_local_main_process and accelerator.state.is_main_process  # these still answer, as there
    with pytest.raises(AttributeError, match="no attribute `num_processes`"):
        accelerator.state.num_processes
    again = Accelerator(cpu=True, mixed_precision="bf16")  # re-instantiating after a reset works
    assert again.state.mixed_precision == "bf16" and accelerator.state.num_processes == 1


def test_enums_have_the_peers_members_and_string_forms():
    assert DistributedType.MULTI_NEURON.value == "MULTI_NEURON" and RNGType.NEURON.value == "neuron"
    assert DynamoBackend.TORCHXLA_TRACE_ONCE.value == "TORCHXLA_TRACE_ONCE"
    assert str(PrecisionType.BF16) == "bf16" and "fp16" in PrecisionType and "fp4" not in PrecisionType
    assert PrecisionType.list() == ["no", "fp8", "fp16", "bf16"]
    assert str(DistributedType.NO) == "DistributedType.NO"  # a plain enum there, as in the peer


def test_copy_tensor_to_devices_on_one_process_returns_the_tensor():
    tensor = torch.tensor([1, 2, 3], dtype=torch.int)
    assert copy_tensor_to_devices(tensor) is tensor
    with pytest.raises(ValueError, match="got None on the only process"):
        copy_tensor_to_devices(None)


def test_tqdm_has_the_peers_signature(capsys):
    assert list(tqdm(range(3))) == [0, 1, 2]
    assert list(tqdm(range(2), main_process_only=False, disable=True)) == [0, 1]
    with pytest.raises(ValueError, match="main_process_only"):
        tqdm(True, range(2))


def test_peer_variables_are_derived_from_the_spec():
    env = LaunchSpec(mixed_precision="bf16", fsdp={"fsdp_version": 2, "fsdp_offload_params": False}).peer_env(
        {"TORCHELASTIC_RESTART_COUNT": "0"})
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16" and env["ACCELERATE_USE_FSDP"] == "true"
    assert env["FSDP_VERSION"] == "2" and env["FSDP_OFFLOAD_PARAMS"] == "false"
    assert "ACCELERATE_USE_DEEPSPEED" not in env
    # the elastic agent's count plus the restarts hasten launch did itself
    assert LaunchSpec(restart_count=2).peer_env({"TORCHELASTIC_RESTART_COUNT": "1"})["TORCHELASTIC_RESTART_COUNT"] == "3"


@pytest.mark.multiprocess
def test_two_processes_see_the_peers_variables_and_types(tmp_path):
    launch("peer_env_probe.py", str(tmp_path), num_processes=2, launch_args=("--mixed_precision", "bf16"))
    records = {rank: json.loads((tmp_path / f"rank{rank}_attempt0.json").read_text()) for rank in (0, 1)}
    for rank, record in records.items():
        env = record["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == (str(rank), str(rank), "2", "2")
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"].isdigit()
        assert env["ACCELERATE_MIXED_PRECISION"] == "bf16" and env["ACCELERATE_USE_CPU"] == "False"
        assert env["ACCELERATE_DYNAMO_BACKEND"] == "NO" and env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert record["before"] == "MULTI_CPU" and record["after"] == ["MULTI_CPU"] * 3
        assert record["copied"] == [[1, 2, 3]]  # copy_tensor_to_devices from the one process that held it


@pytest.mark.multiprocess
def test_a_restart_by_hasten_launch_is_counted_as_torchrun_counts_it(tmp_path):
    result = launch("peer_env_probe.py", str(tmp_path), "--fail-first", num_processes=2,
                    launch_args=("--max_restarts", "1"), timeout=180)
    assert "restarting every process" in result.stderr
    for rank in (0, 1):
        record = json.loads((tmp_path / f"rank{rank}_attempt1.json").read_text())
        assert record["env"]["TORCHELASTIC_RESTART_COUNT"] == "1" and record["env"]["TORCHELASTIC_MAX_RESTARTS"] == "1"


def test_features_hasten_lacks_exist_and_refuse_in_one_sentence():
    from hasten.utils import MegatronLMDummyScheduler

    for refused in (MegatronLMDummyScheduler,):
        with pytest.raises(NotImplementedError) as caught:
            refused(None, total_num_steps=1)
        message = str(caught.value)
        assert message.startswith(refused.__name__) and message.count(". ") == 0 and message.endswith(".")


def test_api_coverage_finds_the_names_a_script_uses():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "api_coverage.py"
    spec = importlib.util.spec_from_file_location("api_coverage", path)
    coverage = importlib.util.module_from_spec(spec)
    sys.modules["api_coverage"] = coverage  # its dataclasses look their module up there
    spec.loader.exec_module(coverage)
    script = ("import accelerate\nfrom accelerate import Accelerator\nfrom accelerate.utils import DistributedType as DT\n"
              "acc = Accelerator()\nif DT.XLA and accelerate.__version__: acc.backward(1); acc.state.mixed_precision\n"
              "acc.native_amp = False\n")
    assert coverage.used_names(script) == {
        "accelerate", "accelerate.Accelerator", "accelerate.utils.DistributedType", "accelerate.utils.DistributedType.XLA",
        "accelerate.__version__", "accelerate.Accelerator.backward", "accelerate.Accelerator.state.mixed_precision"}
    assert coverage.resolve("accelerate.utils.DistributedType.XLA", "hasten")
    assert not coverage.resolve("accelerate.utils.no_such_name", "hasten")


def test_small_accelerator_facts_match_accelerates():
    import accelerate

    from hasten import Accelerator
    from hasten.utils import extract_model_from_parallel

    ours, theirs = Accelerator(cpu=True), accelerate.Accelerator(cpu=True)
    for name in ("multi_device", "is_fsdp2", "should_save_model", "deepspeed_plugin"):
        assert getattr(ours, name) == getattr(theirs, name), name
    spread = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    for device_map, expected in (({"0": "cpu", "1": "disk"}, True), ({"": "cpu"}, False)):
        spread.hf_device_map = device_map
        assert ours.verify_device_map(spread) is theirs.verify_device_map(spread) is expected
    with pytest.raises(ValueError, match="needs a LOMO or AdaLomo optimizer"):
        ours.lomo_backward(torch.ones(()), 0.1)

    class Wrapper(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

    def nested():
        return torch.nn.Sequential(Wrapper(Wrapper(torch.nn.Linear(2, 2))), torch.nn.ReLU())

    mine, peers = extract_model_from_parallel(nested(), recursive=True), accelerate.utils.extract_model_from_parallel(
        nested(), recursive=True)
    assert repr(mine) == repr(peers) and isinstance(mine[0], torch.nn.Linear)
    assert isinstance(extract_model_from_parallel(nested())[0], Wrapper)  # not recursive by default


def test_is_fsdp2_and_multi_device_read_the_run_kind_not_the_enums_printed_name():
    from hasten.state import AcceleratorState

    state = AcceleratorState(cpu=True)
    for kind, fsdp2 in (("FSDP", True), ("MULTI_CPU", False)):
        AcceleratorState._reset_state(True)
        state = AcceleratorState(cpu=True)
        state.distributed_type = __import__("hasten.utils", fromlist=["DistributedType"]).DistributedType(kind)
        assert state.is_fsdp2 is fsdp2
    AcceleratorState._reset_state(True)
