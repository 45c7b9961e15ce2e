"""ProcessTopology.from_env and device/backend choice, from plain dicts (no processes)."""

import pytest
import torch

from hasten.process.topology import ProcessTopology, backend_for_device, first_slurm_host, select_device


def test_plain_process_is_single():
    topology = ProcessTopology.from_env({})
    assert (topology.rank, topology.world_size, topology.launcher) == (0, 1, "none")
    assert not topology.is_distributed and topology.is_main_process and topology.is_last_process


def test_torchrun_variables():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
           "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29601"}
    t = ProcessTopology.from_env(env)
    assert (t.rank, t.world_size, t.local_rank, t.local_world_size) == (3, 4, 1, 2)
    assert (t.node_rank, t.num_nodes, t.master_addr, t.master_port) == (1, 2, "10.0.0.5", 29601)
    assert t.launcher == "torchrun" and t.is_last_process and not t.is_main_process and not t.is_local_main_process


@pytest.mark.parametrize(
    "env",
    [
        {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
         "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
        {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
        {"MV2_COMM_WORLD_RANK": "3", "MV2_COMM_WORLD_SIZE": "4", "MV2_COMM_WORLD_LOCAL_RANK": "1",
         "MV2_COMM_WORLD_LOCAL_SIZE": "2"},
    ],
    ids=["openmpi", "mpich", "mvapich"],
)
def test_mpi_flavours(env):
    t = ProcessTopology.from_env({**env, "MASTER_ADDR": "node1"})
    assert (t.rank, t.world_size, t.local_rank, t.local_world_size, t.node_rank, t.num_nodes) == (3, 4, 1, 2, 1, 2)
    assert t.launcher == "mpi" and t.master_addr == "node1"


def test_torchrun_wins_over_mpi_and_slurm():
    env = {"RANK": "1", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "8",
           "SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8"}
    assert ProcessTopology.from_env(env).launcher == "torchrun"


def test_slurm_step():
    env = {"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
           "SLURM_STEP_NUM_NODES": "4", "SLURM_JOB_NODELIST": "gpu[07-10]"}
    t = ProcessTopology.from_env(env)
    assert (t.rank, t.world_size, t.local_rank, t.local_world_size, t.node_rank, t.num_nodes) == (5, 8, 1, 2, 2, 4)
    assert t.master_addr == "gpu07" and t.launcher == "slurm"


def test_slurm_batch_script_without_srun_is_single_process():
    # sbatch's own shell has SLURM_NTASKS but runs one process: must not wait for 8 peers.
    assert ProcessTopology.from_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}).world_size == 1


@pytest.mark.parametrize(
    "nodelist, first",
    [("node1", "node1"), ("gpu[03-05,09],cpu1", "gpu03"), ("a-b-[1,2]", "a-b-1"), ("x1,x2", "x1"), ("", None)],
)
def test_first_slurm_host(nodelist, first):
    assert first_slurm_host(nodelist) == first


def test_bad_values_are_named():
    with pytest.raises(ValueError, match="WORLD_SIZE='two'"):
        ProcessTopology.from_env({"RANK": "0", "WORLD_SIZE": "two"})
    with pytest.raises(ValueError, match="rank 4 is outside 0..1"):
        ProcessTopology.from_env({"RANK": "4", "WORLD_SIZE": "2"})


def test_device_choice():
    assert select_device(1, cuda_available=True, mps_available=False) == torch.device("cuda", 1)
    assert select_device(1, cpu=True, cuda_available=True) == torch.device("cpu")
    assert select_device(0, cuda_available=False, mps_available=True) == torch.device("mps")
    assert select_device(0, cuda_available=False, mps_available=False) == torch.device("cpu")


def test_backend_choice():
    assert backend_for_device("cuda") == "nccl"
    assert backend_for_device("cpu") == "gloo"
    assert backend_for_device("mps") == "gloo"


def test_srun_with_pmi2_takes_the_local_rank_from_slurm():
    from hasten.process.topology import ProcessTopology

    env = {"PMI_RANK": "5", "PMI_SIZE": "8", "SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1",
           "SLURM_NODEID": "1", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NODELIST": "node[01-02]"}
    topology = ProcessTopology.from_env(env)
    assert (topology.rank, topology.local_rank, topology.node_rank, topology.local_world_size) == (5, 1, 1, 4)
    assert topology.launcher == "slurm"
