"""`hasten.utils` helpers whose behaviour libraries see: device lookup, fp32 outputs and undoing them, padding nested
tensors, concatenating, the kernel check, the environment helpers, and the ParallelismConfig mesh layout."""

from __future__ import annotations

import logging
import os
import pickle
from unittest.mock import MagicMock, Mock, patch

import pytest
import torch


def test_find_device_takes_the_first_tensor_or_none():
    from hasten.utils import find_device

    assert find_device([1, "a", {"x": torch.ones(1)}]) == torch.device("cpu")
    assert find_device({"a": 1, "b": (torch.ones(1),)}) == torch.device("cpu")
    assert find_device([1, "a"]) is None


def test_convert_outputs_to_fp32_refuses_pickling_until_unwrapped():
    from hasten.utils import convert_outputs_to_fp32, extract_model_from_parallel
    from hasten.utils.operations import ConvertOutputsToFp32

    model = torch.nn.Linear(2, 2)
    model._original_forward = model.forward
    model.forward = convert_outputs_to_fp32(lambda x: model._original_forward(x).half())
    assert model(torch.ones(1, 2)).dtype == torch.float32
    with pytest.raises((pickle.PicklingError, AttributeError)):
        pickle.dumps(model)
    with pytest.raises(pickle.PicklingError, match="unwrap_model"):
        pickle.dumps(ConvertOutputsToFp32(model._original_forward))
    model.forward = convert_outputs_to_fp32(model._original_forward)
    unwrapped = extract_model_from_parallel(model, keep_fp32_wrapper=False)
    assert "forward" not in vars(unwrapped) and "_original_forward" not in vars(unwrapped)  # the class's forward again
    assert unwrapped(torch.ones(1, 2)).shape == (1, 2)
    pickle.dumps(unwrapped)


def test_pad_across_processes_leaves_nested_tensors_with_a_warning():
    from hasten.utils import CannotPadNestedTensorWarning, pad_across_processes

    nested = torch.nested.nested_tensor([torch.ones(3), torch.ones(1)])
    with pytest.warns(CannotPadNestedTensorWarning):
        assert pad_across_processes(nested) is nested
    tensor = torch.ones(2, 3)
    assert pad_across_processes(tensor, dim=-4) is tensor  # a dim the tensor lacks: as it is


def test_concatenate_keeps_a_single_batch_and_refuses_several_non_tensors():
    from hasten.utils import concatenate

    assert concatenate(["text"]) == "text"
    with pytest.raises(TypeError, match="Can only concatenate tensors"):
        concatenate([{"c": "a"}, {"c": "b"}])


def test_recursively_apply_refuses_other_leaves_in_accelerates_words():
    from hasten.utils import recursively_apply

    with pytest.raises(TypeError) as caught:
        recursively_apply(torch.tensor, (torch.tensor(1), 1), error_on_other_type=True)
    assert str(caught.value) == ("Unsupported types (<class 'int'>) passed to `tensor`. Only nested list/tuple/dicts "
                                 "of objects that are valid for `is_torch_tensor` should be passed.")


@pytest.mark.parametrize("system, release, warned", [("Linux", "5.4.0-35-generic", True),
                                                     ("Linux", "5.15.0-35-generic", False),
                                                     ("Darwin", "5.4.0", False)])
def test_check_os_kernel_warns_below_5_5_on_linux(system, release, warned, caplog):
    from hasten.utils import check_os_kernel

    with patch("platform.uname", return_value=Mock(release=release, system=system)), caplog.at_level(logging.WARNING):
        check_os_kernel()
    messages = [record.msg for record in caplog.records]
    assert bool(messages) is warned
    if warned:
        assert "5.4.0" in messages[0] and "5.5.0" in messages[0]


def test_convert_dict_to_env_variables_skips_unsafe_lines(caplog):
    from hasten.utils import convert_dict_to_env_variables

    with caplog.at_level(logging.WARNING):
        lines = convert_dict_to_env_variables({"A": "1", "B": "<x", "C": "a b", "D": "", "E": "2"})
    assert lines == ["A=1\n", "E=2\n"]
    assert len(caplog.records) == 3 and "Skipping B=<x" in caplog.records[0].getMessage()


def test_purge_accelerate_environment_restores_the_variables(monkeypatch):
    from hasten.utils import purge_accelerate_environment

    monkeypatch.setenv("ACCELERATE_KEPT", "1")
    monkeypatch.setenv("ACCELERATE_GONE", "2")

    @purge_accelerate_environment
    def meddle():
        os.environ["ACCELERATE_KEPT"] = "changed"
        os.environ["ACCELERATE_NEW"] = "3"
        del os.environ["ACCELERATE_GONE"]

    meddle()
    assert (os.environ["ACCELERATE_KEPT"], os.environ["ACCELERATE_GONE"]) == ("1", "2")
    assert "ACCELERATE_NEW" not in os.environ


def test_purge_accelerate_environment_wraps_tests_of_subclasses_too():
    from hasten.utils import purge_accelerate_environment

    @purge_accelerate_environment
    class Base:
        def test_base(self):
            os.environ["ACCELERATE_FROM_BASE"] = "1"

    class Child(Base):
        def test_child(self):
            os.environ["ACCELERATE_FROM_CHILD"] = "1"

    Child().test_base()
    Child().test_child()
    assert not {"ACCELERATE_FROM_BASE", "ACCELERATE_FROM_CHILD"} & set(os.environ)


def test_find_executable_batch_size_says_when_it_reached_zero():
    from hasten.utils import find_executable_batch_size

    @find_executable_batch_size(starting_batch_size=2)
    def never_fits(batch_size):
        raise torch.OutOfMemoryError("CUDA out of memory.")

    with pytest.raises(RuntimeError, match="No executable batch size found, reached zero"):
        never_fits()
    with pytest.raises(TypeError, match="Batch size was passed into `never_fits`"):
        never_fits(4)


@pytest.mark.parametrize("sizes, names", [({"dp_shard_size": 2, "cp_size": 2, "tp_size": 2}, ("dp_shard", "cp", "tp")),
                                          ({"dp_replicate_size": 2, "dp_shard_size": 4}, ("dp_replicate", "dp_shard")),
                                          ({}, ())])
def test_parallelism_config_get_mesh_in_accelerates_order(sizes, names):
    from hasten.utils import ParallelismConfig

    mesh = ParallelismConfig(**sizes)._get_mesh()
    assert (mesh[0] if mesh else ()) == names


def test_build_device_mesh_slices_flattened_dims_by_list_without_a_group():
    from hasten.utils import ParallelismConfig

    built = MagicMock()
    with patch("torch.distributed.device_mesh.init_device_mesh", return_value=built) as init:
        config = ParallelismConfig(dp_shard_size=2, tp_size=2)
        assert config.build_device_mesh("cpu") is built
    init.assert_called_once_with("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
    assert [call.args for call in built.__getitem__.call_args_list] == [(["dp_shard"],)] * 3


def test_data_structure_round_trip_and_environment_facts(monkeypatch):
    from hasten.utils import (TensorInformation, are_libraries_initialized, get_cpu_distributed_information,
                              get_current_device_type, get_data_structure, initialize_tensors, is_tensor_information)

    layout = get_data_structure({"x": torch.zeros(2, 3, dtype=torch.int64), "meta": "kept"})
    assert layout == {"x": TensorInformation(torch.Size([2, 3]), torch.int64), "meta": "kept"}
    assert is_tensor_information(layout["x"]) and not is_tensor_information(layout["meta"])
    rebuilt = initialize_tensors(layout)
    assert (rebuilt["x"].shape, rebuilt["x"].dtype, rebuilt["meta"]) == (torch.Size([2, 3]), torch.int64, "kept")
    assert are_libraries_initialized("torch", "surely_not_imported_here") == ["torch"]
    # Accelerate 1.16 asks torch.accelerator which accelerator there is, without initialising it
    for reported, expected in [(None, ("cpu", "NO")), ("cuda", ("cuda", "MULTI_GPU")), ("xpu", ("xpu", "NO"))]:
        monkeypatch.setattr(torch.accelerator, "current_accelerator",
                            lambda *a, r=reported: None if r is None else torch.device(r))
        assert get_current_device_type() == expected  # (xpu: no XCCL in this torch build, so no multi-XPU type)
    monkeypatch.undo()
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    for name in ("RANK", "PMI_RANK", "WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    info = get_cpu_distributed_information()
    assert (info.rank, info.world_size) == (2, 4)
