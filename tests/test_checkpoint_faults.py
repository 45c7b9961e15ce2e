"""Faults no peer handles, made real: a flipped bit in a saved file, a file-size limit, a full disk, no permission.

Each runs tests/scripts/ckpt_faults.py through `hasten launch` (1 and 2 processes) and checks what every rank saw:
the one-sentence error (its kind, the file, the checkpoint, the reason), that nothing in memory changed, that the
previous checkpoint is the one `load_state` picks and no staging folder is left, and that a later save works.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import SCRIPTS, launch, results_by_rank, run_with_timeout

PROCESSES = [1, pytest.param(2, marks=pytest.mark.multiprocess)]


def _run(tmp_path, mode, arg="", num_processes=1, engine="ddp"):
    out, project = tmp_path / "out", tmp_path / "project"
    out.mkdir()
    launch("ckpt_faults.py", str(out), str(project), mode, arg, engine, num_processes=num_processes, timeout=180)
    results = results_by_rank(out)
    assert sorted(results) == list(range(num_processes))
    return project / "checkpoints", results


# -- item 2: a bit really flipped -------------------------------------------------------------------------
@pytest.mark.parametrize("num_processes", PROCESSES)
@pytest.mark.parametrize("damaged", ["model.safetensors", "optimizer.bin"])
def test_a_flipped_bit_is_refused_and_fallback_loads_the_previous_checkpoint(tmp_path, damaged, num_processes):
    root, results = _run(tmp_path, "bitflip", damaged, num_processes)
    for rank, result in results.items():
        load = result["load"]
        assert load["error"] == "CheckpointCorrupted", load
        assert f"{damaged} in {root / 'checkpoint_1'} has changed since it was saved" in load["message"], load
        assert result["unchanged"], f"rank {rank}: the refused load changed the live state"
        assert result["fallback"]["result"] == str(root / "checkpoint_0"), result["fallback"]
        assert result["equal_to_first"], f"rank {rank}: the fallback did not restore checkpoint_0's weights"
        assert result["save_after"]["result"] == str(root / "checkpoint_2"), result["save_after"]  # past the damaged one
    warnings = results[0]["warnings"]
    assert len(warnings) == 1 and str(root / "checkpoint_1") in warnings[0] and str(root / "checkpoint_0") in warnings[0]
    assert results.get(1, {"warnings": []})["warnings"] == []  # said once, by the main process


@pytest.mark.multiprocess
@pytest.mark.parametrize("engine, shard", [("fsdp", "pytorch_model_fsdp_0/__1_0.distcp"),  # DCP's file of rank 1
                                           ("deepspeed", "deepspeed/model_0_rank_1.pt")])  # ZeRO partitions of rank 1
def test_a_flipped_bit_in_a_shard_of_another_rank_is_refused_by_every_rank(tmp_path, engine, shard):
    root, results = _run(tmp_path, "bitflip", shard, 2, engine=engine)
    for rank, result in results.items():
        assert result["load"]["error"] == "CheckpointCorrupted", result["load"]
        assert f"{shard} in {root / 'checkpoint_1'} has changed since it was saved" in result["load"]["message"]
        assert result["unchanged"], f"rank {rank}: the refused load changed the live state"
        assert result["fallback"]["result"] == str(root / "checkpoint_0") and result["equal_to_first"], result


def test_the_manifest_records_a_hash_of_every_file_and_old_manifests_still_load(tmp_path):
    import json

    import torch

    from hasten import Accelerator
    from hasten.checkpointing.integrity import ALGORITHM, hash_file
    from hasten.core.errors import CheckpointCorrupted

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(64, 64)
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters()))
    path = tmp_path / "ckpt"
    accelerator.save_state(path)
    manifest_file = path / "hasten_checkpoint.json"
    manifest = json.loads(manifest_file.read_text())
    assert manifest["hashes"]["algorithm"] == ALGORITHM == "xxh3_128"
    assert manifest["hashes"]["files"] == {name: hash_file(path / name) for name in manifest["files"]}
    # A manifest of an earlier hasten has sizes only: it loads, checked by sizes.
    del manifest["hashes"]
    manifest_file.write_text(json.dumps(manifest))
    assert accelerator.load_state(path) == str(path)
    with open(path / "optimizer.bin", "r+b") as file:
        file.truncate(file.seek(0, 2) - 1)
    with pytest.raises(CheckpointCorrupted, match=r"optimizer.bin has \d+ bytes, the manifest says \d+"):
        accelerator.load_state(path)


# -- item 3: writes that fail ---------------------------------------------------------------------------------
def _assert_failed_and_kept(root, results, reason, culprit):
    messages = {result["save"]["message"] for result in results.values()}
    assert len(messages) == 1, f"the ranks failed differently: {messages}"
    message = messages.pop()
    for result in results.values():
        save = result["save"]
        assert save["error"] == "CheckpointWriteError", save
        assert save["seconds"] < 30, save
        assert save["checkpoints"] == ["checkpoint_0"], save  # nothing rotated away, no half-written checkpoint_1
        assert result["staging_left"] == [], result
        assert result["load"]["result"] == str(root / "checkpoint_0"), result["load"]
        assert result["equal_to_first"]
        assert result["save_after"]["result"] == str(root / "checkpoint_1"), result["save_after"]
        assert result["save_after"]["checkpoints"] == ["checkpoint_1"]  # total_limit=1 rotated only after it
    assert message.startswith(f"save_state could not write {root / 'checkpoint_1'} (process {culprit}"), message
    assert reason in message and f"the previous checkpoint {root / 'checkpoint_0'} is kept." in message, message
    return message


@pytest.mark.parametrize("num_processes, limited", [(1, "0"), pytest.param(2, "0", marks=pytest.mark.multiprocess),
                                                    pytest.param(2, "1", marks=pytest.mark.multiprocess)])
def test_a_file_size_limit_fails_every_rank_in_one_sentence_and_keeps_the_previous_checkpoint(
        tmp_path, num_processes, limited):
    root, results = _run(tmp_path, "efbig", limited, num_processes)
    message = _assert_failed_and_kept(root, results, "a file would be larger than this process may write (File too "
                                      "large); raise the file-size limit (ulimit -f)", limited)
    assert f"(process {limited}, {'model.safetensors' if limited == '0' else 'random_states_1.pkl'}):" in message


def _small_filesystem_command(mount: str) -> list[str] | None:
    """A private mount namespace with a 4 MiB tmpfs at `mount` (None where this machine cannot make one).

    As root `unshare -m` is enough; otherwise `-Urm` maps this user to root in a new user namespace, where mounting
    a tmpfs is allowed. The mount lives as long as the launched processes, and nobody else sees it.
    """
    if shutil.which("unshare") is None:
        return None
    as_root = os.geteuid() == 0
    command = ["unshare", "-m" if as_root else "-Urm", "sh", "-c",
               'mount -t tmpfs -o size=4m tmpfs "$0" && exec "$@"', mount]
    probe = subprocess.run([*command, "true"], capture_output=True, text=True)
    return command if probe.returncode == 0 else None


@pytest.mark.parametrize("num_processes", PROCESSES)
def test_a_full_disk_fails_every_rank_in_one_sentence_and_keeps_the_previous_checkpoint(tmp_path, num_processes):
    project = tmp_path / "project"
    project.mkdir()
    prefix = _small_filesystem_command(str(project))
    if prefix is None:
        pytest.skip("no private mount namespace here (unshare -m / -Urm failed), so no small filesystem to fill")
    out = tmp_path / "out"
    out.mkdir()
    command = [*prefix, sys.executable, "-m", "hasten", "launch", "--num_processes", str(num_processes),
               str(SCRIPTS / "ckpt_faults.py"), str(out), str(project), "enospc"]
    result = run_with_timeout(command, 180, {**os.environ, "PYTHONUNBUFFERED": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    _assert_failed_and_kept(project / "checkpoints", results_by_rank(out),
                            "the disk is full (No space left on device); free space or set total_limit", "0")


def test_a_directory_without_write_permission_is_named(tmp_path):
    out, project = tmp_path / "out", tmp_path / "project"
    out.mkdir()
    project.mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, str(SCRIPTS / "ckpt_faults.py"), str(out), str(project), "eacces"]
    if os.geteuid() == 0:  # root writes anywhere: take that power (CAP_DAC_OVERRIDE) away from this process
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: permissions cannot be denied to this process")
        command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *command]
    result = run_with_timeout(command, 120, env)
    assert result.returncode == 0, result.stdout + result.stderr
    _assert_failed_and_kept(project / "checkpoints", results_by_rank(out),
                            "permission is denied (Permission denied); make the directory writable", "0")
