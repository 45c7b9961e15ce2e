"""The multi-machine commands of the README and docs/concepts/elastic.md, run as the pages write them.

Each "machine" is a network namespace with an address of its own (the pages' main address, 10.0.0.1, is machine
0's), a host name of its own and an /etc/hosts naming the machines; two are joined by a veth pair, and no traffic
leaves them. The `hasten` on PATH is this interpreter's; `train.py` is tests/scripts/doc_train.py, copied into the
working directory. Every run must, on every machine it starts:

- end with exit 0 on every machine, no process left behind;
- have each of its P processes report once, with `num_processes` P and `gradient_accumulation_steps` MAX / P
  (MAX: `--num_processes`, the processes at the most machines; 1 for a fixed group);
- use every sample once, step s on the consecutive global batch [s MAX, (s + 1) MAX) of the dataset;
- end with the parameters of one plain process stepping on those global batches (1e-5 relative).

The runs: the README's elastic row on one machine of 8 processes (32 at 4 machines: accumulation 4); its
multi-machine row on two machines (each with its --machine_rank); the elastic page's command, the same on two
machines; the elastic page's SLURM batch script under stand-ins for `srun` and `scontrol` (doc_recipes.py) on two
nodes (the fewest of its ``--nodes=2-4``), each node's `hasten launch` from its own SLURM_NODEID; and the Kubernetes
container command in two "pods" that reach pod 0 as trainer-0.trainer. A last test checks that these are all the
multi-machine commands and recipes the two pages hold.

An elastic first round waits 10 s for more machines after MIN met (the runs start fewer than MAX): each run takes
25-50 s here.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml

from conftest import SCRIPTS, results_by_rank, run_with_timeout
from doc_recipes import (ELASTIC, README, SCONTROL, SRUN, hosts_file, launch_commands, on_host, recipe, recipe_names,
                         sbatch_options, stand_ins)
from machines import clean_env, two_namespaces

TRAIN = SCRIPTS / "doc_train.py"
TIMEOUT = 200  # seconds a run may take, all machines together (25-50 s here alone)
TOLERANCE = 1e-5
SUBNET = "10.0.0"  # the pages' main address, 10.0.0.1, is machine 0's
HOSTS = ("machine-0", "machine-1")

# the commands of the pages that the tests run: key -> (page, what picks the command out of the page's own)
COMMANDS = {"readme-elastic": (README, "--num_machines 1:4"), "readme-machines": (README, "--num_machines 2 "),
            "elastic-page": (ELASTIC, "--num_machines 1:4")}
RECIPES = {ELASTIC: ["elastic-slurm", "elastic-kubernetes"]}


def multi_machine_commands(page: Path) -> set[str]:
    return {command for command in launch_commands(page) if "--num_machines" in command}


def page_command(key: str) -> str:
    page, needle = COMMANDS[key]
    found = sorted(command for command in multi_machine_commands(page) if needle in command + " ")
    assert len(found) == 1, f"{page.name}: expected one multi-machine command with {needle!r}, found {found}"
    return found[0]


# ---------------------------------------------------------------------------- running and checking
def workdir(tmp_path: Path) -> Path:
    shutil.copy(TRAIN, tmp_path / "train.py")
    return tmp_path


def machine_env(**extra: str) -> dict[str, str]:
    """A clean environment whose `hasten` is this interpreter's (the console script beside it)."""
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "hasten").is_file():
        pytest.fail(f"no `hasten` console script beside {sys.executable}: pip install -e .")
    env = clean_env(**extra)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_machines(commands: list[tuple[str, ...]], cwd: Path, env: dict[str, str]) -> str:
    """Start every machine's command at once in `cwd`; all must exit 0 within TIMEOUT (else everything they started
    is killed and the test fails with their output, each line labelled with its machine). Returns the output."""
    lines = [f"cd {shlex.quote(str(cwd))}"]
    for index, command in enumerate(commands):
        lines.append(f"(set -o pipefail; {shlex.join(command)} 2>&1 | sed -u 's/^/[machine {index}] /') &")
        lines.append('pids="$pids $!"')
    # the first machine to fail ends the wait (`wait -n`); bash's `wait -n` answers 127 when two jobs ended together
    # and it has none left to report, so each machine's own status is read at the end (bash keeps them)
    lines.append('while [ -n "$(jobs -pr)" ]; do wait -n || { rc=$?; [ "$rc" = 127 ] || exit "$rc"; }; done')
    lines.append('for pid in $pids; do wait "$pid" || exit $?; done')
    result = run_with_timeout(["bash", "-c", "\n".join(lines)], TIMEOUT, env)
    assert result.returncode == 0, f"a machine failed (exit {result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result.stdout


def assert_trained(cwd: Path, max_processes: int, per_host: dict[str, int]) -> dict[int, dict]:
    """Every process of the run reported; the run trained as one process with the global batch of MAX processes."""
    spec = importlib.util.spec_from_file_location("doc_train", TRAIN)
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)

    results = results_by_rank(cwd / "results")
    world = sum(per_host.values())
    assert sorted(results) == list(range(world)), f"ranks that reported: {sorted(results)}"
    assert max_processes % world == 0, "these commands run at sizes that divide MAX"
    for rank, info in results.items():
        assert (info["world"], info["accumulation"]) == (world, max_processes // world), (rank, info)
    assert Counter(info["hostname"] for info in results.values()) == Counter(per_host), "processes per machine"
    steps = train.SAMPLES // max_processes
    for rank, info in results.items():
        assert len(info["steps"]) == steps, (rank, info["steps"])
    for step in range(steps):
        seen = sorted(index for info in results.values() for index in info["steps"][step])
        assert seen == list(range(step * max_processes, (step + 1) * max_processes)), f"step {step}: {seen}"
    expected = train.reference(max_processes)
    scale = max(value.abs().max().item() for value in expected.values())
    for rank, info in results.items():
        diff = max((torch.tensor(info["parameters"][name]) - value).abs().max().item()
                   for name, value in expected.items())
        assert diff <= TOLERANCE * scale, f"rank {rank}: parameters differ from the plain run's by {diff:.3g}"
    return results


def argument(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


# ---------------------------------------------------------------------------- the README
@pytest.mark.multiprocess
@pytest.mark.timeout(TIMEOUT + 60)
def test_the_readme_elastic_command_trains_one_machine_of_eight_processes_with_the_batch_of_thirty_two(tmp_path):
    command = page_command("readme-elastic")
    argv = shlex.split(command)
    assert (argument(argv, "--num_machines"), argument(argv, "--main_process_ip")) == ("1:4", "10.0.0.1")
    cwd = workdir(tmp_path)
    with two_namespaces(SUBNET) as net, hosts_file(net["namespaces"], dict(zip(HOSTS, net["addresses"]))):
        run_machines([on_host(net["namespaces"][0], HOSTS[0]) + tuple(argv)], cwd, machine_env())
    results = assert_trained(cwd, int(argument(argv, "--num_processes")), {HOSTS[0]: 8})
    assert {info["env"]["HASTEN_MACHINE"] for info in results.values()} == {f"{HOSTS[0]}/0"}
    assert {info["env"]["GLOO_SOCKET_IFNAME"] for info in results.values()} == {net["veths"][0]}


@pytest.mark.multiprocess
@pytest.mark.timeout(TIMEOUT + 60)
def test_the_readme_multi_machine_command_trains_on_two_machines_each_with_its_rank(tmp_path):
    command = page_command("readme-machines")
    argv = shlex.split(command)
    assert argument(argv, "--machine_rank") == "0" and argument(argv, "--main_process_ip") == "10.0.0.1"
    cwd = workdir(tmp_path)
    with two_namespaces(SUBNET) as net, hosts_file(net["namespaces"], dict(zip(HOSTS, net["addresses"]))):
        # "run on each, with its rank": machine 1's command is the page's with --machine_rank 1
        commands = [on_host(net["namespaces"][rank], HOSTS[rank])
                    + tuple(shlex.split(command.replace("--machine_rank 0", f"--machine_rank {rank}")))
                    for rank in (0, 1)]
        run_machines(commands, cwd, machine_env())
    processes = int(argument(argv, "--num_processes"))
    results = assert_trained(cwd, processes, {host: processes // 2 for host in HOSTS})
    for info in results.values():
        assert info["env"]["GROUP_RANK"] == str(HOSTS.index(info["hostname"])), info["env"]


# ---------------------------------------------------------------------------- docs/concepts/elastic.md
@pytest.mark.multiprocess
@pytest.mark.timeout(TIMEOUT + 60)
def test_the_elastic_page_command_is_the_same_on_every_machine(tmp_path):
    argv = shlex.split(page_command("elastic-page"))
    assert argument(argv, "--main_process_ip") == "10.0.0.1" and "--machine_rank" not in argv
    cwd = workdir(tmp_path)
    with two_namespaces(SUBNET) as net, hosts_file(net["namespaces"], dict(zip(HOSTS, net["addresses"]))):
        run_machines([on_host(ns, host) + tuple(argv) for ns, host in zip(net["namespaces"], HOSTS)], cwd,
                     machine_env())
    processes = int(argument(argv, "--num_processes"))  # 16 at 4 machines: 4 a machine
    assert_trained(cwd, processes, {host: processes // 4 for host in HOSTS})


@pytest.mark.multiprocess
@pytest.mark.timeout(TIMEOUT + 60)
def test_the_slurm_recipe_gives_each_node_its_rank_and_trains_on_every_node(tmp_path):
    script = recipe("elastic-slurm", ELASTIC)
    options = sbatch_options(script)
    nodes = int(options["nodes"].split("-")[0])  # the fewest nodes the job may start on
    assert nodes == 2 and options["ntasks-per-node"] == "1"
    names = [f"node{n}" for n in range(1, nodes + 1)]
    cwd = workdir(tmp_path)
    (cwd / "train.sbatch").write_text(script)
    bin_dir = stand_ins(tmp_path / "bin", srun=SRUN, scontrol=SCONTROL)
    with two_namespaces(SUBNET) as net, hosts_file(net["namespaces"], dict(zip(names, net["addresses"]))):
        env = machine_env(SLURM_JOB_ID="4242", SLURM_JOB_NODELIST=f"node[1-{nodes}]", SLURM_NNODES=str(nodes),
                          SLURM_NTASKS_PER_NODE="1", SLURM_NTASKS=str(nodes), SLURM_NODEID="0", SLURM_PROCID="0",
                          SLURM_CPUS_PER_TASK=options["cpus-per-task"],
                          SIM_NODE_NETNS=",".join(f"{n}={ns}" for n, ns in zip(names, net["namespaces"])))
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
        # the batch script runs on the allocation's first node
        run_machines([on_host(net["namespaces"][0], names[0]) + ("bash", "train.sbatch")], cwd, env)
    processes = int(re.search(r"--num_processes (\d+)", script).group(1))
    results = assert_trained(cwd, processes, {name: processes // 4 for name in names})
    for info in results.values():
        node = info["env"]["SLURM_NODEID"]
        assert info["hostname"] == info["env"]["SLURMD_NODENAME"] == names[int(node)], info
        assert info["env"]["HASTEN_MACHINE"] == f"{names[int(node)]}/{node}", "the node's own --machine_rank"


@pytest.mark.multiprocess
@pytest.mark.timeout(TIMEOUT + 60)
def test_the_kubernetes_command_runs_as_written_in_two_pods(tmp_path):
    argv = yaml.safe_load(recipe("elastic-kubernetes", ELASTIC))["command"]
    assert argument(argv, "--main_process_ip") == "trainer-0.trainer"
    pods = ("trainer-0", "trainer-1")
    cwd = workdir(tmp_path)
    with two_namespaces(SUBNET) as net:
        hosts = {**dict(zip(pods, net["addresses"])), "trainer-0.trainer": net["addresses"][0]}
        with hosts_file(net["namespaces"], hosts):
            run_machines([on_host(ns, pod) + tuple(argv) for ns, pod in zip(net["namespaces"], pods)], cwd,
                         machine_env())
    processes = int(argument(argv, "--num_processes"))  # 64 at 8 pods: 8 a pod
    assert_trained(cwd, processes, {pod: processes // 8 for pod in pods})


# ---------------------------------------------------------------------------- nothing left out
def test_every_multi_machine_command_and_recipe_of_the_pages_is_run():
    on_pages = {(page, command) for page in (README, ELASTIC) for command in multi_machine_commands(page)}
    run_here = {(COMMANDS[key][0], page_command(key)) for key in COMMANDS}
    assert on_pages == run_here, f"commands on the pages that no test here runs: {sorted(on_pages - run_here)}"
    for page, names in RECIPES.items():
        assert recipe_names(page) == names, f"{page.name}'s recipes: run each here"
