"""Tensor parallel, pipeline parallel and ParallelismConfig: unit tests, then real multi-process runs.

The multi-process checks compare against the unsplit model computed in the
same process: outputs, losses and every parameter's gradient must agree to
float rounding (gathered from DTensor shards for tensor parallel, per stage
for pipeline parallel).
"""

from __future__ import annotations

import types
import warnings

import pytest
import torch
import torch.distributed as dist
from conftest import launch_ranks

from hasten.strategies.parallel import auto_split_points, expand_tp_plan, model_tp_plan, prepare_pipeline_training, prepare_pippy
from hasten.strategies.parallel.pipeline import _split_annotations
from hasten.strategies.parallel.tensor import apply_tensor_parallel, tp_style
from hasten.parallelism_config import ParallelismConfig

TOLERANCE = 1e-6


# -- ParallelismConfig ------------------------------------------------------------
def test_config_defaults_and_sizes():
    config = ParallelismConfig()
    assert config.total_size == 1
    assert not (config.dp_enabled or config.fsdp_enabled or config.tp_enabled or config.cp_enabled)
    assert not config.needs_sharded_engine
    assert config.mesh_dim_names == ("dp_shard",) and config.mesh_shape == (1,)  # a mesh keeps one dim

    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=3, tp_size=2)
    assert config.total_size == 12 and config.data_parallel_size == 6 and config.non_data_parallel_size == 2
    assert config.dp_enabled and config.fsdp_enabled and config.tp_enabled and config.needs_sharded_engine
    assert config.mesh_dim_names == ("dp_replicate", "dp_shard", "tp") and config.mesh_shape == (2, 3, 2)
    assert config.dp_dim_names == ["dp_replicate", "dp_shard"]
    assert config.dp_shard_cp_dim_names == ["dp_shard"]
    assert config.fsdp_dim_names == ["dp_replicate", "dp_shard_cp"]


@pytest.mark.parametrize("sizes, sharded", [
    ({"dp_replicate_size": 4}, False),  # plain DDP
    ({"dp_shard_size": 4}, True),
    ({"tp_size": 4}, True),
    ({"dp_replicate_size": 2, "dp_shard_size": 2}, True),
])
def test_config_needs_sharded_engine(sizes, sharded):
    config = ParallelismConfig(**sizes)
    assert config.total_size == 4
    assert config.needs_sharded_engine is sharded
    config.validate(4)


def test_config_none_means_one():
    assert ParallelismConfig(dp_replicate_size=None, tp_size=None).total_size == 1


@pytest.mark.parametrize("sizes, message", [
    ({"dp_shard_size": 0}, "dp_shard_size must be a whole number >= 1"),
    ({"tp_size": -1}, "tp_size must be a whole number >= 1"),
    ({"tp_size": 1.5}, "tp_size must be a whole number >= 1"),
    ({"cp_size": 2, "cp_backend": "ring"}, "cp_backend must be 'torch', got"),
    ({"cp_size": 2, "dp_replicate_size": 2}, "set dp_shard_size > 1"),
])
def test_config_errors(sizes, message):
    with pytest.raises(ValueError, match=message):
        ParallelismConfig(**sizes)


def test_tensor_parallel_beside_plain_replication_is_a_layout_as_in_accelerate_116():
    config = ParallelismConfig(dp_replicate_size=2, tp_size=2)  # Accelerate 1.15 refused it; 1.16 takes it
    assert config.mesh_dim_names == ("dp_replicate", "tp") and config.dp_dim_names == ["dp_replicate"]
    assert config.to_json()["_sizes"] == {"dp_replicate": 2, "dp_shard": 1, "tp": 2, "cp": 1, "sp": 1}


def test_config_validate_names_the_mismatch():
    with pytest.raises(ValueError, match=r"needs 4 processes .* but 2 were started; change the sizes so their product is 2"):
        ParallelismConfig(dp_shard_size=2, tp_size=2).validate(2)


def test_build_device_mesh_needs_a_process_group():
    if dist.is_initialized():
        pytest.skip("a process group exists in this test process")
    with pytest.raises(RuntimeError, match="needs the process group"):
        ParallelismConfig(tp_size=2).build_device_mesh("cpu")
    with pytest.raises(ValueError, match="not built yet"):
        ParallelismConfig().get_device_mesh()


# -- tensor-parallel plans ----------------------------------------------------------
class _Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = torch.nn.ModuleDict({"up_proj": torch.nn.Linear(4, 8), "down_proj": torch.nn.Linear(8, 4)})


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([_Layer() for _ in range(3)])
        self.lm_head = torch.nn.Linear(4, 10)


def test_expand_tp_plan_wildcards():
    plan = expand_tp_plan(_Model(), {"layers.*.mlp.up_proj": "colwise", "layers.*.mlp.down_proj": "rowwise",
                                     "lm_head": "colwise_rep"})
    assert plan == {
        "layers.0.mlp.up_proj": "colwise", "layers.0.mlp.down_proj": "rowwise",
        "layers.1.mlp.up_proj": "colwise", "layers.1.mlp.down_proj": "rowwise",
        "layers.2.mlp.up_proj": "colwise", "layers.2.mlp.down_proj": "rowwise",
        "lm_head": "colwise_rep",
    }


def test_expand_tp_plan_star_is_one_component_and_specific_wins():
    model = _Model()
    assert expand_tp_plan(model, {"layers.*": "x"}) == {f"layers.{i}": "x" for i in range(3)}  # not layers.0.mlp
    plan = expand_tp_plan(model, {"layers.*.mlp.*": "colwise", "layers.1.mlp.up_proj": "rowwise"})
    assert plan["layers.1.mlp.up_proj"] == "rowwise" and plan["layers.0.mlp.up_proj"] == "colwise"


def test_expand_tp_plan_strict_and_lenient():
    with pytest.raises(ValueError, match=r"\['layers.\*.attn.q_proj'\] match no module"):
        expand_tp_plan(_Model(), {"layers.*.attn.q_proj": "colwise", "lm_head": "colwise"})
    assert expand_tp_plan(_Model(), {"layers.*.attn.q_proj": "colwise", "lm_head": "colwise"}, strict=False) == {
        "lm_head": "colwise"}


def test_tp_style_names():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    assert isinstance(tp_style("colwise"), ColwiseParallel)
    assert isinstance(tp_style("rowwise_rep"), RowwiseParallel)
    assert isinstance(tp_style("sequence_parallel"), SequenceParallel)
    with pytest.raises(ValueError, match="unknown tensor-parallel style 'diagonal'"):
        tp_style("diagonal")


def test_model_tp_plan_sources():
    model = _Model()
    assert model_tp_plan(model) is None
    model._tp_plan = {"lm_head": "colwise_rep"}
    model.base_model_prefix = "model"
    model.config = types.SimpleNamespace(base_model_tp_plan={"layers.*.mlp.up_proj": "colwise"})
    # no `model` submodule: the base plan's names are used as they are
    assert model_tp_plan(model) == {"lm_head": "colwise_rep", "layers.*.mlp.up_proj": "colwise"}

    wrapper = torch.nn.Module()
    wrapper.model = _Model()
    wrapper.base_model_prefix = "model"
    wrapper.config = model.config
    assert model_tp_plan(wrapper) == {"model.layers.*.mlp.up_proj": "colwise"}


def test_apply_tensor_parallel_without_plan_says_pass_one():
    fake_mesh = types.SimpleNamespace(ndim=1)
    with pytest.raises(ValueError, match="has no tensor-parallel plan .* pass plan="):
        apply_tensor_parallel(_Model(), fake_mesh)


# -- pipeline helpers ---------------------------------------------------------------
def test_auto_split_points_balances_parameters():
    net = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(6)])
    assert auto_split_points(net, 1) == []
    assert auto_split_points(net, 2) == ["3"]
    assert auto_split_points(net, 3) == ["2", "4"]
    # a ModuleList is never called itself: the cut goes inside it
    assert auto_split_points(_Model(), 2) == ["layers.2"]
    with pytest.raises(ValueError, match="only 2 blocks to cut into 3"):
        auto_split_points(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)), 3)


def test_auto_split_points_keeps_no_split_classes_whole():
    big = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    net = torch.nn.Sequential(big, torch.nn.Linear(8, 2))
    assert auto_split_points(net, 2) == ["0.1"]
    assert auto_split_points(net, 2, no_split_module_classes=["Sequential"]) == ["1"]


def test_split_annotations_restore_the_model():
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    with _split_annotations(net, ["1"]) as spec:
        assert list(spec) == ["1"]
        net[1].forward = lambda x: x  # what torch's annotate_split_points does, roughly
    assert "forward" not in net[1].__dict__
    with pytest.raises(ValueError, match="split point 'nope' is not a module"), _split_annotations(net, ["nope"]):
        pass


def test_pipeline_argument_errors():
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="needs loss_fn"):
        prepare_pipeline_training(net, ["1"], example_args=(torch.zeros(2, 2),))
    with pytest.raises(ValueError, match="unknown pipeline schedule 'zb'"):
        prepare_pipeline_training(net, ["1"], example_args=(torch.zeros(2, 2),), loss_fn=torch.nn.functional.mse_loss,
                                  schedule="zb")


def test_prepare_pippy_single_process_is_a_no_op():
    if dist.is_initialized():
        pytest.skip("a process group exists in this test process")
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    x = torch.randn(4, 2)
    expected = net(x)
    assert prepare_pippy(net, example_args=(x,)) is net
    assert torch.equal(net(x), expected) and net.hf_split_points == []


def test_pippy_helpers_keep_accelerate_115s_answers():
    # Accelerate 1.16 removed its PiPPy helpers (`accelerate.inference`); hasten keeps them under its own path,
    # with the answers Accelerate 1.15.0 gave for these inputs (recorded from it, on this machine kind).
    from hasten.strategies.parallel import find_pippy_batch_size, generate_device_map

    net = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the GPUs of the map are absent here
        assert dict(generate_device_map(net, 1)) == dict.fromkeys("0123", "cpu")
        budget = {0: "20KB", 1: "20KB", "cpu": "1GB"}
        assert dict(generate_device_map(net, 2, max_memory=budget)) == {"0": 1, "1": "cpu", "2": "cpu", "3": "cpu"}
    for args, kwargs, expected in [((torch.ones(3, 2),), None, 3), (("a", [torch.ones(5)]), {"x": torch.ones(2)}, 5),
                                   ((), {"s": "t", "x": torch.ones(4, 1)}, 4), (None, None, None), ((1,), {}, None)]:
        assert find_pippy_batch_size(args, kwargs) == expected


# -- real processes ----------------------------------------------------------------
@pytest.fixture(scope="module")
def pipeline_runs(tmp_path_factory):
    return launch_ranks("pp_check.py", tmp_path_factory.mktemp("pp"), num_processes=2)


@pytest.fixture(scope="module")
def tp_runs(tmp_path_factory):
    return launch_ranks("tp_check.py", tmp_path_factory.mktemp("tp2"), num_processes=2)


@pytest.fixture(scope="module")
def tp4_runs(tmp_path_factory):
    return launch_ranks("tp_check.py", tmp_path_factory.mktemp("tp4"), num_processes=4)


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_pipeline_inference_equals_unsplit(pipeline_runs):
    first, last = pipeline_runs[0], pipeline_runs[1]
    for result in (first, last):
        assert result["auto_split_points"] == ["blocks.2"]  # embed + 2 blocks | 2 blocks + head
        assert result["infer_gathered"] <= TOLERANCE  # gather_output=True: every rank has the output
        assert result["infer_padded"] <= TOLERANCE  # a smaller batch is padded, then cut back
        assert result["reference_untouched"] == 0.0
        assert result["infer_dict"] <= TOLERANCE  # kwargs in, {"logits": ...} out, padded batch of 6
        assert result["pippy_forward"] <= TOLERANCE  # build_pipeline + pippy_forward, gathered
    assert first["infer_last_is_none"] and not last["infer_last_is_none"]
    assert last["infer_last"] <= TOLERANCE


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_training_equals_unsplit(pipeline_runs, schedule):
    first, last = pipeline_runs[0][schedule], pipeline_runs[1][schedule]
    # the two stages hold disjoint halves of the model, under the model's own names
    assert first["names"] == ["blocks.0.fc.bias", "blocks.0.fc.weight", "blocks.1.fc.bias", "blocks.1.fc.weight",
                              "embed.bias", "embed.weight"]
    assert last["names"] == ["blocks.2.fc.bias", "blocks.2.fc.weight", "blocks.3.fc.bias", "blocks.3.fc.weight",
                             "head.bias", "head.weight"]
    for stage in (first, last):
        assert max(stage["loss"]) <= TOLERANCE, f"{schedule}: losses differ by {stage['loss']}"
        assert max(stage["grad"]) <= TOLERANCE, f"{schedule}: gradients differ by {stage['grad']}"
    assert first["loss_value"] == last["loss_value"] > 0.01  # broadcast to every stage


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
@pytest.mark.parametrize("case, sharded", [("mlp", 4), ("stack", 8), ("own_plan", 8)])
def test_tensor_parallel_equals_unsplit(tp_runs, case, sharded):
    for rank, result in tp_runs.items():
        assert result["mesh_dims"] == ["tp"]
        check = result[case]
        assert check["sharded"] == sharded and check["names_match"]
        assert max(check["output"]) <= TOLERANCE, f"rank {rank} {case}: outputs differ by {check['output']}"
        assert max(check["grad"]) <= TOLERANCE, f"rank {rank} {case}: gradients differ by {check['grad']}"


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_four_process_meshes_and_fsdp_times_tp(tp4_runs):
    for rank, result in tp4_runs.items():
        meshes = result["meshes"]
        assert meshes["{'dp_replicate_size': 2, 'dp_shard_size': 2}"] == {
            "dims": ["dp_replicate", "dp_shard"], "flat": {"dp": 4, "dp_shard_cp": 2, "dp_cp": 4}}
        assert meshes["{'dp_shard_size': 4}"] == {"dims": ["dp_shard"], "flat": {"dp": 4, "dp_shard_cp": 4, "dp_cp": 4}}
        fsdp_tp = meshes["fsdp_tp"]
        assert fsdp_tp["dims"] == ["dp_shard", "tp"]
        # tp innermost: neighbouring ranks share a tp group
        assert fsdp_tp["tp_ranks"] == [rank - rank % 2, rank - rank % 2 + 1]
        assert fsdp_tp["dp_ranks"] == [rank % 2, rank % 2 + 2]
        check = result["fsdp_tp"]
        assert check["names_match"]
        assert max(check["output"]) <= TOLERANCE and max(check["grad"]) <= TOLERANCE, check
