"""Several "machines" on this host, for the multi-machine tests: a clean environment, a rendezvous port, two
network namespaces joined by a veth pair (separate hosts with their own addresses; removed afterwards), and one
machine's `hasten launch` with its output in a file, which a test can SIGKILL with everything it started."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

from hasten.launch.plan import find_free_port, port_in_use

# Variables a surrounding launcher (or the developer's shell) may have set; they would change what we test.
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                      "MASTER_PORT", "HASTEN_LAUNCH_SPEC", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
                      "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS")

# torch's rendezvous settings, shortened for the elastic tests: a lost machine's keep-alive expires in 6 s (not 15) and
# a group waits 5 s for latecomers (not hasten's 10), so each re-formation costs the suite ~12 s instead of ~25
SHORT_RDZV = ("--rdzv_conf", "last_call_timeout=5,keep_alive_interval=2,keep_alive_max_attempt=3")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARIABLES and not k.startswith(("OMPI_", "PMI_", "SLURM_"))}
    # HASTEN_CONFIG_FILE: a config file written by `hasten config` on this machine must not change the runs
    return {**env, "PYTHONUNBUFFERED": "1", "HASTEN_CONFIG_FILE": "/nonexistent/hasten.yaml", **extra}


def rendezvous_port() -> int:
    """A free port below the ephemeral range.

    Machine 1 may try to connect before machine 0 listens; retried connects
    to a local port inside the ephemeral range can land on themselves (TCP
    self-connect: source port == destination port) and then wait forever.
    Real multi-node ports (29500) are below the range too.
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randrange(20000, max(20001, min(low, 32768)))
        if not port_in_use(port):
            return port
    return find_free_port()


@contextlib.contextmanager
def two_namespaces(subnet: str = "10.200.7") -> Iterator[dict]:
    """Namespaces A (SUBNET.1) and B (SUBNET.2) joined by a veth pair; removed afterwards, even on failure.

    Yields {"namespaces", "veths", "addresses"}; skips the test where namespaces cannot be made (no root, no `ip`).
    """
    if os.geteuid() != 0:
        pytest.skip("creating network namespaces (ip netns add) needs root")
    if shutil.which("ip") is None:
        pytest.skip("the `ip` command (iproute2) is not installed")
    tag = str(os.getpid() % 100000)
    namespaces = (f"hasten-a-{tag}", f"hasten-b-{tag}")
    veths = (f"hva{tag}", f"hvb{tag}")  # interface names: at most 15 characters
    addresses = (f"{subnet}.1", f"{subnet}.2")
    created: list[str] = []
    try:
        for name in namespaces:
            result = ip("netns", "add", name)
            if result.returncode != 0:
                pytest.skip(f"`ip netns add` does not work here: {result.stderr.strip()}")
            created.append(name)
        steps = [("link", "add", veths[0], "type", "veth", "peer", "name", veths[1])]
        for ns, veth, address in zip(namespaces, veths, addresses):
            steps += [("link", "set", veth, "netns", ns),
                      ("-n", ns, "addr", "add", f"{address}/24", "dev", veth),
                      ("-n", ns, "link", "set", veth, "up"),
                      ("-n", ns, "link", "set", "lo", "up")]
        for step in steps:
            result = ip(*step)
            if result.returncode != 0:
                pytest.fail(f"ip {' '.join(step)} failed: {result.stderr.strip()}")
        yield {"namespaces": namespaces, "veths": veths, "addresses": addresses}
    finally:
        for name in created:
            ip("netns", "del", name)  # takes its end of the veth pair with it
        ip("link", "del", veths[0])  # only exists if it was never moved; errors ignored


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


# ---------------------------------------------------------------------------------------------- one machine's launch
MARK = "HASTEN_TEST_ELASTIC_MACHINE"  # in each machine's environment, so a test can kill exactly one machine


@dataclass
class Machine:
    """One `hasten launch` of a multi-machine run, its output kept in a file."""

    command: list[str]
    mark: str
    log: Path
    process: subprocess.Popen | None = None

    def start(self) -> "Machine":
        self.process = subprocess.Popen(self.command, stdout=self.log.open("a"), stderr=subprocess.STDOUT,
                                        env=clean_env(**{MARK: self.mark}), start_new_session=True)
        return self

    def kill(self) -> None:
        """SIGKILL the launcher and every process it started (workers run in sessions of their own)."""
        kill_marked(self.mark)
        if self.process is not None:
            self.process.wait(30)

    def terminate(self) -> None:
        """SIGTERM to the launcher alone (a person stopping it, a spot machine's notice): it stops its workers."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout)


def kill_marked(mark: str) -> None:
    """SIGKILL every process whose environment carries this machine's mark."""
    needle = f"{MARK}={mark}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    os.kill(int(entry.name), signal.SIGKILL)


def wait_for(condition: Callable[[], object], timeout: float, what: str, machines: list[Machine]) -> float:
    """Poll `condition` until it holds (returns the wall time then); fail with the machines' logs after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return time.time()
        time.sleep(0.05)
    logs = "\n".join(f"--- {m.log.name}:\n{m.log.read_text()[-4000:]}" for m in machines)
    pytest.fail(f"{what} did not happen within {timeout:.0f} s\n{logs}")
