"""Several machines: `hasten launch --num_machines 2` run twice (once per "machine") trains like one process.

The two machines are two `hasten launch` processes started concurrently,
either both on this machine's loopback (static and c10d rendezvous) or in
two network namespaces joined by a veth pair, where gloo only works if
hasten names the right interface (GLOO_SOCKET_IFNAME). Each run trains
tests/scripts/mp_train_equivalence.py (through mn_probe_train.py, which
first records how each rank was started) and must reach the parameters
of a plain single-process run.

Also here: what `hasten launch` refuses before starting anything, and the
exact commands `--dry_run` prints for the multi-machine modes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from conftest import SCRIPTS, results_by_rank, run_with_timeout
from machines import clean_env, rendezvous_port, two_namespaces
from hasten.launch.plan import LaunchError, LaunchPlan, available_cpus, find_free_port

PROBE = SCRIPTS / "mn_probe_train.py"
EQUIVALENCE = SCRIPTS / "mp_train_equivalence.py"
TOLERANCE = 1e-6
TIMEOUT = 120
# name -> (1 process with the global batch, 2 processes with the per-process batch)
CONFIGS = {
    "plain": ("plain:16:1:0:sgd", "plain:8:1:0:sgd"),
    "accum3": ("accum3:16:3:0:sgd", "accum3:8:3:0:sgd"),
}
# ---------------------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def single_process(tmp_path_factory) -> Path:
    """The reference: plain `python mp_train_equivalence.py` with the global batch."""
    out = tmp_path_factory.mktemp("single") / "one"
    command = [sys.executable, str(EQUIVALENCE), str(out), *(c[0] for c in CONFIGS.values())]
    result = run_with_timeout(command, TIMEOUT, clean_env())
    assert result.returncode == 0, f"{shlex.join(command)}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return out


def run_machines(commands: list[list[str]], envs: list[dict[str, str]], timeout: float = TIMEOUT) -> list[subprocess.CompletedProcess]:
    """Start every command at once (each in its own session); all must exit 0 within `timeout` seconds.

    On timeout, or as soon as one command fails, every session still running
    is killed (no orphaned ranks) and the test fails with all output.
    """
    processes, files = [], []
    deadline = time.monotonic() + timeout
    timed_out = False
    try:
        for command, env in zip(commands, envs):
            out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            files.append((out, err))
            processes.append(subprocess.Popen(command, stdout=out, stderr=err, text=True, env=env,
                                              start_new_session=True))
        # Wait for all; one machine failing leaves the other waiting for its rendezvous: stop early then.
        while any(process.poll() is None for process in processes):
            if any(process.poll() not in (None, 0) for process in processes):
                break
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.1)
    finally:
        for process in processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    results = []
    for command, process, (out, err) in zip(commands, processes, files):
        out.seek(0)
        err.seek(0)
        results.append(subprocess.CompletedProcess(command, process.returncode, out.read(), err.read()))
        out.close()
        err.close()
    report = "\n".join(f"--- machine command {i}: exit {r.returncode}: {shlex.join(r.args)}\n"
                       f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}" for i, r in enumerate(results))
    if timed_out:
        pytest.fail(f"the machines did not finish within {timeout}s\n{report}")
    if any(r.returncode != 0 for r in results):
        pytest.fail(f"a machine's hasten launch failed\n{report}")
    return results


def machine_command(machine_rank: int, main_ip: str, port: int, out: Path, *extra: str,
                    prefix: tuple[str, ...] = ()) -> list[str]:
    return [*prefix, sys.executable, "-m", "hasten", "launch", "--num_machines", "2", "--machine_rank",
            str(machine_rank), "--main_process_ip", main_ip, "--main_process_port", str(port),
            "--num_processes", "2", *extra, str(PROBE), str(out), *(c[1] for c in CONFIGS.values())]


def _load(path: Path) -> dict:
    return {k: v.double() for k, v in load_file(str(path)).items()}


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def assert_matches_single_process(one: Path, two: Path) -> None:
    """The 2-process run's final parameters equal the single-process run's (and training did something)."""
    for name in CONFIGS:
        init_one, init_two = _load(one / f"{name}.init.safetensors"), _load(two / f"{name}.init.safetensors")
        final_one, final_two = _load(one / f"{name}.safetensors"), _load(two / f"{name}.safetensors")
        assert _max_diff(init_one, init_two) == 0.0, f"{name}: different initial parameters"
        assert _max_diff(final_one, init_one) > 0.05, f"{name}: training barely moved the parameters"
        diff = _max_diff(final_one, final_two)
        assert diff <= TOLERANCE, f"{name}: single-process and 2-machine parameters differ by {diff:.3g}"
        for rank in (0, 1):
            info = json.loads((two / f"{name}.rank{rank}.json").read_text())
            assert info["loader_len"] == 8 and info["micro_batches"] == 8 * 3, (name, rank, info)


def assert_probe(out: Path) -> dict[int, dict]:
    """Two ranks of world size 2, one per machine, joined by a working gloo group (torchrun-started)."""
    probes = results_by_rank(out / "probe")
    assert sorted(probes) == [0, 1], f"probe files: {sorted(probes)}"
    for rank, info in probes.items():
        assert info["world_size"] == 2 and info["rank"] == rank, info
        assert info["launcher"] == "torchrun" and info["backend"] == "gloo", info
        assert info["local_rank"] == 0 and info["env"]["LOCAL_WORLD_SIZE"] == "1", info  # 1 process per machine
        assert info["node_rank"] == rank and info["env"]["GROUP_RANK"] == str(rank), info
        assert info["gathered"] == [1, 11], info
        assert info["reduced_sum"] == 3.0, info
    assert probes[0]["pid"] != probes[1]["pid"]
    return probes


# ---------------------------------------------------------------------------- two machines on loopback
@pytest.mark.multiprocess
def test_two_machines_static_rendezvous(single_process, tmp_path):
    out, port = tmp_path / "two", rendezvous_port()
    # machine 1 starts first: it must wait for machine 0's rendezvous, not fail
    commands = [machine_command(rank, "127.0.0.1", port, out) for rank in (1, 0)]
    run_machines(commands, [clean_env(HASTEN_TEST_MACHINE="1"), clean_env(HASTEN_TEST_MACHINE="0")])
    probes = assert_probe(out)
    for rank, info in probes.items():
        # static rendezvous: --machine_rank decides which machine hosts which rank
        assert info["env"]["HASTEN_TEST_MACHINE"] == str(rank), info
        assert info["env"]["MASTER_ADDR"] == "127.0.0.1" and info["env"]["MASTER_PORT"] == str(port), info
        assert info["env"]["GLOO_SOCKET_IFNAME"] is None, "no interface should be forced for a loopback main address"
    assert_matches_single_process(single_process, out)


@pytest.mark.multiprocess
def test_two_machines_c10d_rendezvous(single_process, tmp_path):
    out, port = tmp_path / "two", rendezvous_port()
    commands = [machine_command(rank, "127.0.0.1", port, out, "--rdzv_backend", "c10d") for rank in (0, 1)]
    run_machines(commands, [clean_env(HASTEN_TEST_MACHINE="0"), clean_env(HASTEN_TEST_MACHINE="1")])
    probes = assert_probe(out)
    # c10d hands out node ranks in arrival order; each machine must still get exactly one rank
    assert {info["env"]["HASTEN_TEST_MACHINE"] for info in probes.values()} == {"0", "1"}
    assert all(info["env"]["TORCHELASTIC_RUN_ID"] == "hasten" for info in probes.values())
    assert_matches_single_process(single_process, out)


# ---------------------------------------------------------------------------- two network namespaces
@pytest.fixture(scope="module")
def veth_namespaces():
    """Namespaces A (10.200.7.1) and B (10.200.7.2) joined by a veth pair; removed afterwards, even on failure."""
    with two_namespaces("10.200.7") as made:
        yield made


@pytest.mark.multiprocess
def test_two_machines_in_network_namespaces(single_process, veth_namespaces, tmp_path):
    namespaces, veths = veth_namespaces["namespaces"], veth_namespaces["veths"]
    main_ip = veth_namespaces["addresses"][0]
    out, port = tmp_path / "two", rendezvous_port()
    commands = [machine_command(rank, main_ip, port, out, prefix=("ip", "netns", "exec", namespaces[rank]))
                for rank in (0, 1)]
    run_machines(commands, [clean_env(HASTEN_TEST_MACHINE="0"), clean_env(HASTEN_TEST_MACHINE="1")])
    probes = assert_probe(out)
    for rank, info in probes.items():
        assert info["env"]["HASTEN_TEST_MACHINE"] == str(rank), info
        assert info["env"]["MASTER_ADDR"] == main_ip, info
        # hasten chose the veth: machine 0 owns the main address, machine 1 routes to it through its veth
        assert info["env"]["GLOO_SOCKET_IFNAME"] == veths[rank], info
        assert info["env"]["NCCL_SOCKET_IFNAME"] == veths[rank], info
    assert_matches_single_process(single_process, out)


# ---------------------------------------------------------------------------- interface choice (unit level)
def _plan(**kwargs) -> LaunchPlan:
    settings = {"target": "train.py", "num_processes": 2, "num_machines": 2, "machine_rank": 1,
                "main_process_ip": "10.200.7.1", "main_process_port": 29501}
    return LaunchPlan(**{**settings, **kwargs})


@pytest.fixture
def detected(monkeypatch):
    """Replace the `ip`-based detection; records the addresses asked about."""
    asked: list[str] = []

    def fake(address: str) -> str:
        asked.append(address)
        return "auto0"

    monkeypatch.setattr("hasten.launch.plan.interface_for_address", fake)
    return asked


def test_worker_env_names_the_interface_for_a_remote_main_ip(detected):
    env = _plan().worker_env({})
    assert detected == ["10.200.7.1"]
    assert env["GLOO_SOCKET_IFNAME"] == "auto0" and env["NCCL_SOCKET_IFNAME"] == "auto0"


def test_worker_env_names_no_interface_for_loopback_or_one_machine(detected):
    for plan in (_plan(main_process_ip="127.0.0.1"), _plan(main_process_ip="localhost"),
                 _plan(num_machines=1, machine_rank=0)):
        env = plan.worker_env({})
        assert "GLOO_SOCKET_IFNAME" not in env and "NCCL_SOCKET_IFNAME" not in env, plan
    assert detected == []


def test_worker_env_keeps_the_users_interface(detected):
    env = _plan().worker_env({"GLOO_SOCKET_IFNAME": "mine0", "NCCL_SOCKET_IFNAME": "mine1"})
    assert env["GLOO_SOCKET_IFNAME"] == "mine0" and env["NCCL_SOCKET_IFNAME"] == "mine1"


def test_network_interface_overrides_the_detected_one(detected):
    assert _plan(network_interface="flag0").worker_env({})["GLOO_SOCKET_IFNAME"] == "flag0"
    # also where nothing would be detected (loopback main address, one machine)
    assert _plan(network_interface="flag0", main_process_ip="127.0.0.1").worker_env({})["GLOO_SOCKET_IFNAME"] == "flag0"
    one_machine = _plan(network_interface="flag0", num_machines=1, machine_rank=0)
    assert one_machine.worker_env({})["NCCL_SOCKET_IFNAME"] == "flag0"
    assert detected == []


def _own_non_loopback_ipv4() -> tuple[str, str] | None:
    try:
        output = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in output.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "inet" and parts[1] != "lo" and not parts[3].startswith("127."):
            return parts[3].split("/")[0], parts[1].split("@")[0]
    return None


def test_worker_env_detects_this_machines_interface_for_real():
    """Without mocks: a main address this machine owns maps to the interface carrying it."""
    found = _own_non_loopback_ipv4()
    if found is None:
        pytest.skip("this machine has no non-loopback IPv4 address (or no `ip` command)")
    address, interface = found
    assert _plan(main_process_ip=address, machine_rank=0).worker_env({})["GLOO_SOCKET_IFNAME"] == interface


# ---------------------------------------------------------------------------- refused before anything starts
def hasten_launch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "hasten", "launch", *args]
    return run_with_timeout(command, 60, env or clean_env())


@pytest.fixture
def tattletale(tmp_path) -> tuple[Path, Path]:
    """A script that leaves a file behind if it ever runs."""
    marker = tmp_path / "it_ran"
    script = tmp_path / "tattletale.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('yes')\n")
    return script, marker


@pytest.mark.parametrize("flags, message", [
    (("--num_machines", "2", "--machine_rank", "2", "--main_process_ip", "127.0.0.1", "--num_processes", "2"),
     "machine_rank 2"),
    (("--num_machines", "2", "--machine_rank", "0", "--main_process_ip", "127.0.0.1", "--num_processes", "3"),
     "not divisible"),
    (("--num_machines", "2", "--machine_rank", "1", "--num_processes", "2"), "main_process_ip"),
    (("--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "127.0.0.1", "--num_processes", "3",
      "--num_processes_per_machine", "2"), "disagrees with --num_processes_per_machine"),
    (("--num_processes", "2", "--use_deepspeed", "--use_fsdp"), "cannot be used together"),
])
def test_impossible_launch_is_refused_before_starting(tattletale, flags, message):
    script, marker = tattletale
    result = hasten_launch(*flags, str(script))
    assert result.returncode == 2, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hasten launch: error:"), result.stderr
    assert message in lines[0], result.stderr
    assert not marker.exists(), "the script was started although the launch was refused"


def test_the_tattletale_runs_when_the_launch_is_valid(tattletale):
    """Control for the test above: the same script, launched validly, does leave its file."""
    script, marker = tattletale
    result = hasten_launch("--num_processes", "1", str(script))
    assert result.returncode == 0, result.stderr
    assert marker.exists()


@pytest.mark.parametrize("kwargs, message", [
    ({"num_machines": 2, "machine_rank": 2}, "machine_rank 2 is not below num_machines 2"),
    ({"num_machines": 2, "machine_rank": -1}, "is not below"),
    ({"num_machines": 2, "num_processes": 3}, "is not divisible by num_machines 2"),
    ({"num_machines": 2, "main_process_ip": None}, "needs main_process_ip"),
    ({"main_process_port": 70000}, "between 1 and 65535"),
])
def test_launch_plan_validate_refuses(tattletale, kwargs, message):
    script, _ = tattletale
    settings = {"target": str(script), "num_processes": 2, "num_machines": 1, "machine_rank": 0,
                "main_process_ip": "127.0.0.1", **kwargs}
    with pytest.raises(LaunchError, match=message):
        LaunchPlan(**settings).validate(check_port=False)


def test_several_machines_agree_on_the_default_port(tattletale):
    script, _ = tattletale
    plan = LaunchPlan(target=str(script), num_processes=2, num_machines=2, machine_rank=1,
                      main_process_ip="127.0.0.1").validate()
    assert plan.main_process_port == 29500  # a random port could differ between machines


# ---------------------------------------------------------------------------- --dry_run
def dry_run(*args: str) -> tuple[dict[str, str], list[str]]:
    """(environment, argv) printed by `hasten launch --dry_run ARGS`."""
    result = hasten_launch("--dry_run", *args)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    tokens = shlex.split(result.stdout)
    start = tokens.index(sys.executable) if sys.executable in tokens else next(
        i for i, t in enumerate(tokens) if "=" not in t)
    env = dict(token.split("=", 1) for token in tokens[:start])
    return env, tokens[start:]


def test_dry_run_static_multi_node(tattletale):
    script, marker = tattletale
    port = find_free_port()
    env, argv = dry_run("--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "127.0.0.1",
                        "--main_process_port", str(port), "--num_processes", "4", str(script), "a", "--flag")
    assert argv == [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2",
                    "--node-rank=1", "--master-addr=127.0.0.1", f"--master-port={port}", "--max-restarts=0",
                    "--monitor-interval=0.1", "-m", "hasten.launch.worker", str(script), "a", "--flag"]
    assert env["OMP_NUM_THREADS"] == str(max(1, available_cpus() // 2))
    assert "HASTEN_LAUNCH_SPEC" in env and "GLOO_SOCKET_IFNAME" not in env
    assert not marker.exists()


def test_dry_run_per_machine_count_and_default_port(tattletale):
    script, _ = tattletale
    _, argv = dry_run("--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "127.0.0.1",
                      "--num_processes_per_machine", "3", str(script))
    assert argv[3:8] == ["--nnodes=2", "--nproc-per-node=3", "--node-rank=1", "--master-addr=127.0.0.1",
                         "--master-port=29500"]


def test_dry_run_c10d_multi_node(tattletale):
    script, _ = tattletale
    port = find_free_port()
    _, argv = dry_run("--num_machines", "2", "--machine_rank", "0", "--main_process_ip", "127.0.0.1",
                      "--main_process_port", str(port), "--num_processes", "2", "--rdzv_backend", "c10d", str(script))
    assert argv == [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
                    "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=hasten",
                    "--max-restarts=0", "--monitor-interval=0.1", "-m", "hasten.launch.worker", str(script)]


def test_dry_run_shows_the_network_interface(tattletale):
    script, _ = tattletale
    env, _ = dry_run("--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "10.200.7.1",
                     "--num_processes", "2", "--network_interface", "flag0", str(script))
    assert env["GLOO_SOCKET_IFNAME"] == "flag0" and env["NCCL_SOCKET_IFNAME"] == "flag0"


def test_explicit_network_interface_beats_the_environment():
    from hasten.launch.plan import LaunchPlan

    plan = LaunchPlan(target="x.py", num_processes=2, num_machines=2, main_process_ip="10.200.9.1",
                      network_interface="eth7")
    env = plan.worker_env({"GLOO_SOCKET_IFNAME": "old0"})
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "eth7"
