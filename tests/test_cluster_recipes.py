"""The multi-node recipes of docs/multi-node.md, run against a simulation of each cluster's environment.

Nothing here starts a real multi-node run (tests/test_doc_commands.py runs
the elastic page's recipes for real). Each test takes a recipe (a SLURM
batch script, a PyTorchJob manifest, an MPI hostfile and command) *from the
documentation page itself* (doc_recipes.py reads the pages and holds the
stand-ins), runs it with the variables the cluster would set and with fake
`srun` / `scontrol` / `mpirun` / `hasten` / `python` commands that only
record what they were given, and then follows what hasten would do with it:

    recorded `hasten launch` argv  ->  hasten's parser, config, LaunchPlan
    LaunchPlan's torchrun argv     ->  torch's own torchrun parser (with the pod/task environment)
    torchrun's per-process env     ->  ProcessTopology.from_env, LaunchSpec.from_env

and asserts that every process ends up with the right rank, world size,
local rank, machine rank and rendezvous address. Runs that start their
processes directly (srun, mpirun, one pod per rank) go straight to
`ProcessTopology.from_env` with the environment of each simulated process.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from doc_recipes import (ELASTIC, MULTI_NODE, RECORDER, SCONTROL, SRUN, expand_nodelist, recipe, sbatch_options,
                         stand_ins)
from hasten.cli.launch import build_plan, resolve_config
from hasten.cli.main import build_parser
from hasten.process.launch_spec import LaunchSpec
from hasten.process.topology import ProcessTopology
from hasten.utils.environment import clear_environment

# Variables of a surrounding launcher (or of the machine running the tests) that must not leak into a simulation.
_FOREIGN = re.compile(r"^(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK|NODE_RANK|ROLE_RANK|MASTER_ADDR|"
                      r"MASTER_PORT|TORCHELASTIC_.*|HASTEN_.*|GLOO_SOCKET_IFNAME|NCCL_SOCKET_IFNAME|OMP_NUM_THREADS|"
                      r"CUDA_VISIBLE_DEVICES|SLURM_.*|SLURMD_.*|OMPI_.*|PMI_.*|PMIX_.*|MPI_.*|MV2_.*|PET_.*)$")


@pytest.fixture
def cluster(tmp_path: Path) -> dict[str, Any]:
    """A working directory with train.py and a bin/ of fake cluster commands that record their calls."""
    bin_dir = stand_ins(tmp_path / "bin", hasten=RECORDER, python=RECORDER, scontrol=SCONTROL, srun=SRUN,
                        mpirun=RECORDER, mpiexec=RECORDER)
    (tmp_path / "train.py").write_text("print('training')\n")
    base = {k: v for k, v in os.environ.items() if not _FOREIGN.match(k)}
    base["PATH"] = f"{bin_dir}{os.pathsep}{base.get('PATH', '')}"
    return {"dir": tmp_path, "record": tmp_path / "calls.jsonl", "base": base}


def run_shell(cluster: dict[str, Any], script: str, env: dict[str, str]) -> list[dict[str, Any]]:
    """Run a recipe's shell script in the simulated environment; return what the fake commands recorded."""
    full_env = {**cluster["base"], **env, "SIM_RECORD": str(cluster["record"])}
    result = subprocess.run(["bash", "-c", script], cwd=cluster["dir"], env=full_env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, f"recipe failed:\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    calls = [json.loads(line) for line in cluster["record"].read_text().splitlines()]
    return sorted(calls, key=lambda call: int(call["env"].get("SLURM_PROCID", 0)))  # srun's tasks run at once


# ---------------------------------------------------------------------------- what hasten and torchrun do with it
@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """os.environ replaced by `env` for the block (torchrun's parser reads PET_* defaults from it)."""
    with clear_environment():
        os.environ.update(env)
        yield


@contextlib.contextmanager
def working_directory(path: Path) -> Iterator[None]:
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


@pytest.fixture
def offline_network(monkeypatch):
    """The simulated hosts do not exist here: no port can be probed on them and `ip route` knows none."""
    import hasten.launch.plan as plan_module

    monkeypatch.setattr(plan_module, "port_in_use", lambda port, host="127.0.0.1": False)
    monkeypatch.setattr(plan_module, "interface_for_address",
                        lambda address: None if address in ("localhost", "127.0.0.1") else "ib0")


def hasten_launch(call: dict[str, Any], cwd: Path):
    """The LaunchPlan `hasten launch` builds from a recorded call (argv and environment of the fake `hasten`)."""
    assert call["program"] == "hasten" and call["argv"][0] == "launch", call["argv"]
    env = {**call["env"], "HASTEN_CONFIG_FILE": str(cwd / "no-config.yaml")}  # no config file on the nodes
    with environment(env), working_directory(cwd):
        args = build_parser().parse_args(call["argv"])
        plan = build_plan(args, resolve_config(args))
    return plan


def torchrun_processes(plan, launcher_env: dict[str, str]) -> list[dict[str, str]]:
    """The environment of each process torchrun starts for `plan` on its machine (static rendezvous)."""
    from torch.distributed.run import config_from_args, parse_args

    env = plan.worker_env(launcher_env)
    with environment(env):
        args = parse_args(plan.torchrun_argv())
        config, _, _ = config_from_args(args)
    assert config.rdzv_backend == "static", "these recipes use torchrun's static rendezvous"
    host, _, port = config.rdzv_endpoint.rpartition(":")
    node_rank, nproc, nnodes = config.rdzv_configs["rank"], config.nproc_per_node, config.max_nodes
    return [{**env, "RANK": str(node_rank * nproc + local), "LOCAL_RANK": str(local), "GROUP_RANK": str(node_rank),
             "ROLE_RANK": str(node_rank * nproc + local), "WORLD_SIZE": str(nnodes * nproc),
             "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": host, "MASTER_PORT": port, "TORCHELASTIC_RUN_ID": "none"}
            for local in range(nproc)]


def topologies(envs: list[dict[str, str]]) -> list[ProcessTopology]:
    return sorted((ProcessTopology.from_env(env) for env in envs), key=lambda t: t.rank)


def assert_layout(found: list[ProcessTopology], nodes: int, per_node: int, master: str, port: int, launcher: str) -> None:
    """Every rank once; each process's local rank, machine and rendezvous as the layout says."""
    assert [t.rank for t in found] == list(range(nodes * per_node))
    for t in found:
        assert (t.world_size, t.local_world_size, t.num_nodes) == (nodes * per_node, per_node, nodes), t
        assert (t.local_rank, t.node_rank) == (t.rank % per_node, t.rank // per_node), t
        assert (t.master_addr, t.master_port, t.launcher) == (master, port, launcher), t


# ---------------------------------------------------------------------------- SLURM
def sbatch_env(script: str, job_id: int, nodelist: str) -> dict[str, str]:
    """What `sbatch` gives the batch script for its #SBATCH options (``--nodes=MIN-MAX``: MIN nodes)."""
    options = sbatch_options(script)
    nodes, per_node = int(options["nodes"].split("-")[0]), int(options["ntasks-per-node"])
    assert len(expand_nodelist(nodelist)) == nodes
    return {"SLURM_JOB_ID": str(job_id), "SLURM_JOB_NODELIST": nodelist, "SLURM_NNODES": str(nodes),
            "SLURM_NTASKS_PER_NODE": str(per_node), "SLURM_NTASKS": str(nodes * per_node),
            "SLURM_CPUS_PER_TASK": options.get("cpus-per-task", "1"), "SLURM_PROCID": "0", "SLURM_NODEID": "0"}


def test_slurm_sbatch_with_one_hasten_launch_per_node(cluster, offline_network):
    script = recipe("slurm-launch")
    options = sbatch_options(script)
    assert options["ntasks-per-node"] == "1" and options["signal"] == "TERM@120"
    calls = run_shell(cluster, script, sbatch_env(script, job_id=4242, nodelist="gpu[07-08]"))

    assert len(calls) == 2, "srun starts one `hasten launch` per node"
    processes = []
    for node, call in enumerate(calls):
        assert call["env"]["SLURM_NODEID"] == str(node)
        plan = hasten_launch(call, cluster["dir"])
        assert (plan.num_machines, plan.machine_rank, plan.num_processes) == (2, node, 8)
        assert (plan.main_process_ip, plan.main_process_port) == ("gpu07", 20000 + 4242 % 20000)
        assert plan.target_args == ("--project_dir", "runs/exp")
        env = plan.worker_env(call["env"])
        assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "ib0"  # the route to gpu07
        assert LaunchSpec.from_env(env) == plan.spec
        processes += torchrun_processes(plan, call["env"])
    # each process still carries srun's SLURM_PROCID (the node's task number): torchrun's RANK must win
    assert {p["SLURM_PROCID"] for p in processes} == {"0", "1"}
    assert_layout(topologies(processes), nodes=2, per_node=4, master="gpu07", port=24242, launcher="torchrun")


@pytest.mark.parametrize("page, name", [(MULTI_NODE, "slurm-launch"), (ELASTIC, "elastic-slurm")])
def test_slurm_recipe_needs_single_quotes_around_the_srun_command(cluster, offline_network, page, name):
    """The pitfall the recipes avoid: in double quotes the batch shell expands $SLURM_NODEID once, for every node.
    (tests/test_doc_commands.py runs the elastic recipe for real.)"""
    script = recipe(name, page)
    command = re.search(r"srun (?:--no-kill )?bash -c '(.*)'", script, re.DOTALL).group(1)
    env = sbatch_env(script, job_id=7, nodelist="gpu[07-08]")
    ranks = [hasten_launch(call, cluster["dir"]).machine_rank for call in run_shell(cluster, script, env)]
    assert ranks == [0, 1], "each node passes its own SLURM_NODEID"
    cluster["record"].unlink()
    broken = script.replace(f"'{command}'", f'"{command}"')
    ranks = [hasten_launch(call, cluster["dir"]).machine_rank for call in run_shell(cluster, broken, env)]
    assert ranks == [0, 0], "both nodes would claim machine rank 0"


def test_slurm_srun_one_process_per_rank(cluster):
    script = recipe("slurm-srun")
    assert "--gpus-per-task" not in script, "every task must see all the node's GPUs (device cuda:SLURM_LOCALID)"
    calls = run_shell(cluster, script, sbatch_env(script, job_id=31337, nodelist="cn[1-2]"))

    assert [c["program"] for c in calls] == ["python"] * 8 and all(c["argv"][0] == "train.py" for c in calls)
    assert all(c["env"]["SIM_SRUN_OPTIONS"] == "--mpi=none" for c in calls)
    assert all(c["env"]["OMP_NUM_THREADS"] == "8" for c in calls)
    assert_layout(topologies([c["env"] for c in calls]), nodes=2, per_node=4, master="cn1", port=20000 + 31337 % 20000,
                  launcher="slurm")


def test_slurm_batch_shell_itself_is_one_process(cluster):
    """Code run by the batch script outside srun sees SLURM_NTASKS=8 but must not wait for 7 peers."""
    script = recipe("slurm-srun")
    env = sbatch_env(script, job_id=1, nodelist="cn[1-2]")
    topology = ProcessTopology.from_env(env)
    assert (topology.world_size, topology.launcher) == (1, "none")


# ---------------------------------------------------------------------------- Kubernetes PyTorchJob
def pytorchjob_pods(manifest: dict[str, Any], port: int = 23456) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """(container, environment) of every pod the training operator creates, with the variables it sets.

    Master: RANK 0, MASTER_ADDR localhost; worker i: RANK i + 1, MASTER_ADDR <job>-master-0; WORLD_SIZE = pods.
    """
    name = manifest["metadata"]["name"]
    specs = manifest["spec"]["pytorchReplicaSpecs"]
    world = sum(spec.get("replicas", 1) for spec in specs.values())
    pods = []
    for role in ("Master", "Worker"):
        for index in range(specs[role].get("replicas", 1)):
            containers = specs[role]["template"]["spec"]["containers"]
            container = next(c for c in containers if c["name"] == "pytorch")
            rank = 0 if role == "Master" else index + 1
            addr = "localhost" if role == "Master" else f"{name}-master-0"
            env = {"MASTER_ADDR": addr, "MASTER_PORT": str(port), "WORLD_SIZE": str(world), "RANK": str(rank),
                   "PET_MASTER_ADDR": addr, "PET_MASTER_PORT": str(port), "PET_NNODES": str(world),
                   "PET_NODE_RANK": str(rank), "PYTHONUNBUFFERED": "1"}
            pods.append((container, env))
    return pods


def test_pytorchjob_one_hasten_launch_per_pod(cluster, offline_network):
    manifest = yaml.safe_load(recipe("pytorchjob"))
    assert manifest["kind"] == "PyTorchJob"
    pods = pytorchjob_pods(manifest)
    assert len(pods) == 3
    processes = []
    for rank, (container, pod_env) in enumerate(pods):
        cluster["record"].unlink(missing_ok=True)
        assert container["command"] == ["bash", "-c"]
        [call] = run_shell(cluster, container["args"][0], pod_env)
        gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
        plan = hasten_launch(call, cluster["dir"])
        assert (plan.num_machines, plan.machine_rank, plan.processes_per_machine) == (3, rank, gpus)
        assert plan.main_process_ip == ("localhost" if rank == 0 else "train-master-0")
        env = plan.worker_env(call["env"])
        if rank:  # the interface that routes to the master's service; none needed for localhost
            assert env["GLOO_SOCKET_IFNAME"] == "ib0"
        # the pod's RANK/WORLD_SIZE (pods) are inherited; torchrun's per-process values must replace them
        for process in torchrun_processes(plan, call["env"]):
            assert process["WORLD_SIZE"] == str(3 * gpus)
            topology = ProcessTopology.from_env(process)
            assert topology.node_rank == rank and topology.master_port == 23456
            processes.append(topology)
    assert [t.rank for t in sorted(processes, key=lambda t: t.rank)] == list(range(12))
    assert all(t.world_size == 12 and t.local_world_size == 4 and t.launcher == "torchrun" for t in processes)


def test_pytorchjob_one_process_per_pod_reads_the_pod_variables(cluster):
    manifest = yaml.safe_load(recipe("pytorchjob"))
    found = topologies([env for _, env in pytorchjob_pods(manifest)])
    assert [t.rank for t in found] == [0, 1, 2]
    assert all(t.world_size == 3 and t.local_rank == 0 and t.master_port == 23456 for t in found)
    assert [t.master_addr for t in found] == ["localhost", "train-master-0", "train-master-0"]
    assert all(t.is_local_main_process for t in found)  # each pod is its own machine


# ---------------------------------------------------------------------------- MPI
def test_mpi_hostfile_recipe(cluster, offline_network):
    hostfile = cluster["dir"] / "hosts.txt"
    hostfile.write_text(recipe("mpi-hostfile"))
    slots = [(line.split()[0], int(line.split("slots=")[1])) for line in hostfile.read_text().splitlines() if line]
    command = " ".join(recipe("mpi-launch").replace("\\\n", " ").split())
    call = {"program": "hasten", "argv": shlex.split(command)[1:], "env": cluster["base"]}
    plan = hasten_launch(call, cluster["dir"])

    assert plan.mode == "mpirun" and plan.spec.cpu
    argv = plan.mpirun_argv(is_root=False, cpus=16)
    assert argv[:3] == ["mpirun", "-np", "8"] and argv[argv.index("--hostfile") + 1] == "hosts.txt"
    forwarded = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-x"]
    assert forwarded == ["MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "HASTEN_LAUNCH_SPEC"]
    launcher_env = plan.worker_env(call["env"])
    assert (launcher_env["MASTER_ADDR"], launcher_env["MASTER_PORT"]) == ("10.0.0.1", "29500")

    # Open MPI fills each host's slots in hostfile order; ranks on every host get only the forwarded variables
    processes, rank = [], 0
    for host, count in slots:
        for local in range(count):
            env = {name: launcher_env[name] for name in forwarded}
            env.update(OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_SIZE=str(plan.num_processes),
                       OMPI_COMM_WORLD_LOCAL_RANK=str(local), OMPI_COMM_WORLD_LOCAL_SIZE=str(count))
            assert LaunchSpec.from_env(env).cpu
            processes.append(env)
            rank += 1
    assert rank == plan.num_processes
    assert_layout(topologies(processes), nodes=2, per_node=4, master="10.0.0.1", port=29500, launcher="mpi")


def test_mpich_recipe(cluster):
    calls = run_shell(cluster, recipe("mpich"), {})
    [call] = calls
    assert call["program"] == "mpiexec"
    argv = call["argv"]
    total, per_host = int(argv[argv.index("-n") + 1]), int(argv[argv.index("-ppn") + 1])
    hosts = argv[argv.index("-hosts") + 1].split(",")
    assert total == per_host * len(hosts)
    # what MPICH's hydra gives each rank (PMI-1 variables), plus the exported rendezvous (-envall)
    processes = [{**call["env"], "PMI_RANK": str(r), "PMI_SIZE": str(total), "MPI_LOCALRANKID": str(r % per_host),
                  "MPI_LOCALNRANKS": str(per_host)} for r in range(total)]
    assert_layout(topologies(processes), nodes=len(hosts), per_node=per_host, master="10.0.0.1", port=29500,
                  launcher="mpi")
