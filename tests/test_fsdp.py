"""FSDP2 on 2 CPU processes: the same parameters as one unsharded process, really sharded, exact resume.

The reference is the same script run by plain python (one process, global
batch 16, no sharding); the FSDP runs use 2 processes with batch 8 each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from conftest import SCRIPTS, launch, run_with_timeout

SCRIPT = "fsdp_train.py"
PEER_CONFIG = """compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
enable_cpu_affinity: false
fsdp_config:
{fsdp_keys}machine_rank: 0
main_training_function: main
mixed_precision: 'no'
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""
PEER_FSDP1 = """  fsdp_activation_checkpointing: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch: BACKWARD_PRE
  fsdp_cpu_ram_efficient_loading: true
  fsdp_forward_prefetch: false
  fsdp_offload_params: false
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_sync_module_states: true
  fsdp_transformer_layer_cls_to_wrap: Block
  fsdp_use_orig_params: true
  fsdp_version: 1
"""
PEER_FSDP2 = """  fsdp_activation_checkpointing: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_cpu_ram_efficient_loading: true
  fsdp_offload_params: false
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_transformer_layer_cls_to_wrap: Block
  fsdp_version: 2
"""
TOLERANCE = 1e-5
STEPS = 8


def _runs(ckpt, ckpt_full, launched: bool) -> list[str]:
    batch = 8 if launched else 16
    return [
        f"plain:{batch}:1:0:{STEPS}:flags",
        f"accum:{batch}:2:0:{STEPS}:flags:midsave",  # reduce-scatter only on the optimizer step
        f"accumsync:{batch}:2:1:{STEPS}:flags:midsave",  # sync_each_batch: sharded gradients every batch
        f"ac:{batch}:1:0:{STEPS}:ac",  # size-based wrap + activation checkpointing
        f"ckpt:{batch}:1:0:{STEPS}:flags:save@3@{ckpt}",  # SHARDED_STATE_DICT (DCP)
        f"ckptfull:{batch}:1:0:{STEPS}:full:save@3@{ckpt_full}",  # FULL_STATE_DICT
        f"bf16:{batch}:1:0:{STEPS}:bf16",  # bf16 compute (MixedPrecisionPolicy + autocast), fp32 reduce
        f"meta:{batch}:1:0:{STEPS}:meta",  # cpu_ram_efficient_loading: rank 1 builds on meta, gets rank 0's weights
        f"clipvalue:{batch}:1:0:{STEPS}:flags:clipvalue",  # clip_grad_value_ on DTensor gradients (Accelerate 1.16)
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp")
    one, two = root / "one", root / "two"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "HASTEN_LAUNCH_SPEC")}
    result = run_with_timeout([sys.executable, str(SCRIPTS / SCRIPT), str(one),
                               *_runs(root / "ref_ckpt", root / "ref_ckpt_full", False)], 180, env)
    assert result.returncode == 0, result.stderr
    # Config files as the peer's `accelerate config` writes them: FSDP1 for the first launch, FSDP2 for the second.
    (root / "fsdp1.yaml").write_text(PEER_CONFIG.format(fsdp_keys=PEER_FSDP1))
    (root / "fsdp2.yaml").write_text(PEER_CONFIG.format(fsdp_keys=PEER_FSDP2))
    first = launch(SCRIPT, str(two), *_runs(root / "ckpt", root / "ckpt_full", True),
                   launch_args=("--config_file", str(root / "fsdp1.yaml")), timeout=300)
    # a new launch resumes from each checkpoint and trains the remaining steps
    launch(SCRIPT, str(two), f"resumed:8:1:0:{STEPS}:flags:resume@{root / 'ckpt'}",
           f"resumedfull:8:1:0:{STEPS}:full:resume@{root / 'ckpt_full'}",
           launch_args=("--config_file", str(root / "fsdp2.yaml")), timeout=180)
    return root, one, two, first


def _load(path):
    return {k: v.double() for k, v in load_file(str(path)).items()}


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def _info(directory, name, rank=0):
    return json.loads((directory / f"{name}.rank{rank}.json").read_text())


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", ["plain", "accum", "accumsync", "ac", "ckpt", "ckptfull", "meta", "clipvalue"])
def test_fsdp_equals_one_unsharded_process(runs, name):
    _, one, two, _ = runs
    reference, sharded = _load(one / f"{name}.safetensors"), _load(two / f"{name}.safetensors")
    diff = _max_diff(reference, sharded)
    assert diff <= TOLERANCE, f"{name}: FSDP on 2 processes differs from 1 unsharded process by {diff:.3g}"
    losses_one, losses_two = _info(one, name)["losses"], _info(two, name)["losses"]
    assert losses_two == pytest.approx(losses_one, abs=1e-5)
    assert losses_one[-1] < losses_one[0]
    # the sharded gradients' norms (2, inf, and 0: how many gradients are not zero) are the whole gradients'
    norms_one, norms_two = _info(one, name)["norms"], _info(two, name)["norms"]
    assert norms_two == pytest.approx(norms_one, rel=1e-5) and norms_one[2] == 14  # 3 Blocks x 4 + the head's 2


@pytest.mark.multiprocess
def test_bf16_trains_close_to_the_bf16_reference(runs):
    _, one, two, _ = runs
    diff = _max_diff(_load(one / "bf16.safetensors"), _load(two / "bf16.safetensors"))
    moved = _max_diff(_load(two / "bf16.safetensors"), _load(two / "plain.safetensors"))
    assert diff < 0.05, f"bf16 FSDP drifted {diff:.3g} from the bf16 reference"
    assert moved > 0, "bf16 gave exactly the fp32 result: the precision policy was not applied"
    assert _info(two, "bf16")["losses"][-1] < _info(two, "bf16")["losses"][0]


@pytest.mark.multiprocess
def test_accumulation_is_not_ignored(runs):
    _, _, two, _ = runs
    assert _max_diff(_load(two / "plain.safetensors"), _load(two / "accum.safetensors")) > 1e-3


@pytest.mark.multiprocess
def test_each_process_holds_about_half_the_parameters(runs):
    _, _, two, _ = runs
    infos = [_info(two, "plain", rank) for rank in (0, 1)]
    total = infos[0]["total_params"]
    assert sum(i["local_params"] for i in infos) == total
    for info in infos:
        assert 0.4 * total <= info["local_params"] <= 0.6 * total, info
        assert info["distributed_type"] == "FSDP"
        assert info["fsdp_plugin"] == "FullyShardedDataParallelPlugin"
    # get_state_dict gathers the full state on the main process only
    assert infos[0]["state_keys"] == 14 and infos[1]["state_keys"] == 0


@pytest.mark.multiprocess
def test_sharded_checkpoint_resumes_to_the_same_parameters(runs):
    root, _, two, _ = runs
    uninterrupted = _load(two / "ckpt.safetensors")
    assert _max_diff(uninterrupted, _load(two / "resumed.safetensors")) <= 1e-7
    assert _max_diff(_load(two / "ckptfull.safetensors"), _load(two / "resumedfull.safetensors")) <= 1e-7
    # the resumed run really started at step 3: it ran 5 of the 8 steps
    assert len(_info(two, "resumed")["losses"]) == STEPS - 3
    manifest = json.loads((root / "ckpt" / "hasten_checkpoint.json").read_text())
    files = manifest["files"]
    for expected in ("pytorch_model_fsdp_0/.metadata", "pytorch_model_fsdp_0/__0_0.distcp",
                     "pytorch_model_fsdp_0/__1_0.distcp", "optimizer_0/.metadata"):
        assert expected in files, sorted(files)
    # each process hashed the shards it wrote, and together they hashed every file (checked before any load)
    assert sorted(manifest["hashes"]["files"]) == sorted(files)
    assert "model.safetensors" in json.loads((root / "ckpt_full" / "hasten_checkpoint.json").read_text())["files"]


@pytest.mark.multiprocess
def test_merge_weights_turns_shards_into_safetensors(runs, tmp_path):
    root, one, _, _ = runs
    result = subprocess.run([sys.executable, "-m", "hasten", "merge-weights", str(root / "ckpt"), str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    merged = _load(tmp_path / "model.safetensors")
    full = _load(root / "ckpt_full" / "model.safetensors")  # the FULL_STATE_DICT checkpoint of the same step
    assert _max_diff(merged, full) <= 1e-6


@pytest.mark.multiprocess
def test_mid_accumulation_save_needs_sync_each_batch(runs):
    _, _, two, _ = runs
    error = _info(two, "accum")["error"]
    assert "sync_each_batch" in error and "sync_gradients" in error, error
    assert _info(two, "accumsync")["error"] == ""  # reduced gradients every batch: saving works


@pytest.mark.multiprocess
def test_fsdp_version_1_runs_on_fsdp2_with_one_notice(runs):
    *_, first = runs
    output = first.stdout + first.stderr
    assert output.count("fsdp_version 1 is run on FSDP2") == 1, output[-2000:]


@pytest.mark.multiprocess
def test_2d_meshes_equal_one_process(runs, tmp_path):
    """4 processes: 2 replicas x 2 shards (ParallelismConfig), batch 4 each, against the reference's batch 16."""
    _, one, _, _ = runs
    # and 2 shards x 2-way tensor parallel (batch 8 per data-parallel group: the 2 processes of a group see the same)
    launch(SCRIPT, str(tmp_path), f"plain:4:1:0:{STEPS}:hsdp", f"tp:8:1:0:{STEPS}:tp", num_processes=4,
           launch_args=("--use_fsdp",), timeout=240)
    for name, mesh in (("plain", ["dp_replicate", "dp_shard"]), ("tp", ["dp_shard", "tp"])):
        diff = _max_diff(_load(one / "plain.safetensors"), _load(tmp_path / f"{name}.safetensors"))
        assert diff <= TOLERANCE, f"{mesh} on 4 processes differs from 1 unsharded process by {diff:.3g}"
        infos = [_info(tmp_path, name, rank) for rank in range(4)]
        assert infos[0]["mesh"] == mesh
        assert infos[0]["losses"] == pytest.approx(_info(one, "plain")["losses"], abs=1e-5)
        # under tp, gradients on two meshes (the Blocks' on dp_shard x tp, the head's on dp_shard) make one norm
        assert infos[0]["norms"] == pytest.approx(_info(one, "plain")["norms"], rel=1e-5)
    total = _info(tmp_path, "plain")["total_params"]
    assert all(0.4 * total <= _info(tmp_path, "plain", r)["local_params"] <= 0.6 * total for r in range(4))
    # tensor parallel x FSDP: the Blocks' weights are split 4 ways
    assert all(_info(tmp_path, "tp", r)["local_params"] < 0.4 * total for r in range(4))


def test_plugin_from_a_peer_config_section():
    from hasten import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin.from_launch_config(
        {"fsdp_version": 2, "fsdp_sharding_strategy": "SHARD_GRAD_OP", "fsdp_state_dict_type": "FULL_STATE_DICT",
         "fsdp_transformer_layer_cls_to_wrap": "Block,Layer"})
    assert plugin.reshard_after_forward is False
    assert plugin.transformer_cls_names_to_wrap == ["Block", "Layer"]
    with pytest.raises(ValueError, match="state_dict_type='LOCAL'"):
        FullyShardedDataParallelPlugin(state_dict_type="LOCAL")


def test_wrap_policy_names_a_missing_class():
    from hasten import FullyShardedDataParallelPlugin
    from hasten.strategies.fsdp.strategy import wrap_unit_filter

    with pytest.raises(ValueError, match="does not contain"):
        wrap_unit_filter(FullyShardedDataParallelPlugin(auto_wrap_policy="TRANSFORMER_BASED_WRAP",
                                                        transformer_cls_names_to_wrap=["Nope"]), torch.nn.Linear(2, 2))
