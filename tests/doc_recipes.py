"""The docs' launch commands and cluster recipes, read from the pages themselves, and what runs them here.

- `recipe(name, page)`: the fenced block after ``<!-- recipe: NAME -->`` on a page;
  `launch_commands(page)`: every `hasten launch` command line of a page (code spans and lines of fenced blocks).
- Stand-ins for SLURM's commands, put first on PATH by a test: `scontrol show hostnames` and an `srun` that runs
  its command once per node, all nodes at once, with the variables srun gives each task; when the test names a
  network namespace for a node (``SIM_NODE_NETNS="node1=ns-a,node2=ns-b"``), that node's task runs in it, under
  the node's own host name, as on a node of its own.
- `hosts_file` / `on_host`: a network namespace's own /etc/hosts (which `ip netns exec` mounts over /etc/hosts)
  and the prefix that runs a command in the namespace under a host name of its own.

tests/test_cluster_recipes.py follows the recipes of docs/multi-node.md through recording stand-ins;
tests/test_doc_commands.py runs the multi-machine commands of the README and docs/concepts/elastic.md for real.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import sys
from pathlib import Path
from typing import Iterator, Mapping

ROOT = Path(__file__).resolve().parent.parent
MULTI_NODE = ROOT / "docs" / "multi-node.md"
ELASTIC = ROOT / "docs" / "concepts" / "elastic.md"
README = ROOT / "README.md"


# ---------------------------------------------------------------------------- the pages
def recipe(name: str, page: Path = MULTI_NODE) -> str:
    """The fenced block that follows ``<!-- recipe: NAME -->`` on `page` (docs/multi-node.md by default)."""
    text = page.read_text()
    match = re.search(rf"<!-- recipe: {re.escape(name)} -->\s*\n```[a-z]*\n(.*?)\n```", text, re.DOTALL)
    assert match, f"{page.relative_to(ROOT)} has no recipe block named {name!r}"
    return match.group(1) + "\n"


def recipe_names(page: Path) -> list[str]:
    return re.findall(r"<!-- recipe: ([\w-]+) -->", page.read_text())


def launch_commands(page: Path) -> list[str]:
    """Every `hasten launch` command line of `page`, whitespace normalised: the code spans that hold one, and the
    lines of fenced blocks that start with one (backslash continuations joined, a trailing ``# comment`` cut). A
    command line names what it runs (a ``.py`` file or ``-m module``); a span without one mentions a flag
    (``hasten launch --max_restarts N``). Commands inside another command (``srun bash -c 'exec hasten launch
    ...'``) are recipes: see `recipe`."""
    text = page.read_text()
    blocks = re.findall(r"^```[a-z]*\n(.*?)\n```", text, re.DOTALL | re.MULTILINE)
    prose = re.sub(r"^```[a-z]*\n.*?\n```", "", text, flags=re.DOTALL | re.MULTILINE)
    found = re.findall(r"`(hasten launch [^`]+)`", prose)
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line.startswith("hasten launch "):
                found.append(line)
    commands = [command.split() for command in found]
    return [" ".join(words) for words in commands if "-m" in words or any(w.endswith(".py") for w in words)]


def sbatch_options(script: str) -> dict[str, str]:
    """The ``#SBATCH --key=value`` lines of a batch script."""
    return dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?", script, re.MULTILINE))


def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's compact host list (``node[001-003,007],login1``) as host names."""
    hosts = []
    for prefix, ranges in re.findall(r"([^,\[]+)(?:\[([^\]]+)\])?,?", nodelist):
        if not ranges:
            hosts.append(prefix)
            continue
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            for number in range(int(first), int(last or first) + 1):
                hosts.append(f"{prefix}{number:0{len(first)}d}")
    return hosts


# ---------------------------------------------------------------------------- stand-in cluster commands
RECORDER = """\
import json, os, sys
with open(os.environ["SIM_RECORD"], "a") as out:
    out.write(json.dumps({"program": os.path.basename(sys.argv[0]), "argv": sys.argv[1:], "env": dict(os.environ)}) + "\\n")
"""

SCONTROL = """\
import re, sys
assert sys.argv[1:3] == ["show", "hostnames"], sys.argv
for prefix, ranges in re.findall(r"([^,\\[]+)(?:\\[([^\\]]+)\\])?,?", sys.argv[3]):
    if not ranges:
        print(prefix)
        continue
    for part in ranges.split(","):
        first, _, last = part.partition("-")
        for number in range(int(first), int(last or first) + 1):
            print(f"{prefix}{number:0{len(first)}d}")
"""

# srun: the command once per task, every task at once, with the variables srun gives each; a node with a network
# namespace (SIM_NODE_NETNS) runs its tasks there, under the node's host name
SRUN = """\
import os, subprocess, sys
args = sys.argv[1:]
options = []
while args and args[0].startswith("-"):
    options.append(args.pop(0))
hosts = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                       capture_output=True, text=True, check=True).stdout.split()
namespaces = dict(pair.split("=") for pair in os.environ.get("SIM_NODE_NETNS", "").split(",") if pair)
per_node = int(os.environ["SLURM_NTASKS_PER_NODE"])
tasks = []
for node, host in enumerate(hosts):
    prefix = []
    if host in namespaces:
        prefix = ["ip", "netns", "exec", namespaces[host], "unshare", "--uts", "sh", "-c",
                  'hostname "$0" && exec "$@"', host]
    for local in range(per_node):
        env = dict(os.environ, SLURM_NODEID=str(node), SLURM_PROCID=str(node * per_node + local),
                   SLURM_LOCALID=str(local), SLURM_STEP_NUM_TASKS=str(len(hosts) * per_node),
                   SLURM_STEP_NUM_NODES=str(len(hosts)), SLURM_STEP_NODELIST=os.environ["SLURM_JOB_NODELIST"],
                   SLURMD_NODENAME=host, SLURM_STEP_ID="0", SIM_SRUN_OPTIONS=" ".join(options))
        tasks.append(subprocess.Popen(prefix + args, env=env))
sys.exit(max(task.wait() for task in tasks))
"""


def stand_ins(bin_dir: Path, **bodies: str) -> Path:
    """Executables named after the keywords, each running its Python body with this interpreter; returns bin_dir."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, body in bodies.items():
        path = bin_dir / name
        path.write_text(f"#!{sys.executable}\n{body}")
        path.chmod(0o755)
    return bin_dir


# ---------------------------------------------------------------------------- hosts of their own
@contextlib.contextmanager
def hosts_file(namespaces: tuple[str, ...], hosts: Mapping[str, str]) -> Iterator[None]:
    """Give each network namespace an /etc/hosts naming `hosts` (name -> address) besides localhost; `ip netns exec`
    mounts /etc/netns/NAME/hosts over /etc/hosts. Removed afterwards, even on failure."""
    lines = "127.0.0.1 localhost\n::1 localhost\n" + "".join(f"{address} {name}\n" for name, address in hosts.items())
    folders = [Path("/etc/netns") / name for name in namespaces]
    try:
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text(lines)
        yield
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            Path("/etc/netns").rmdir()  # only when no one else's namespace has a folder there


def on_host(namespace: str, hostname: str | None = None) -> tuple[str, ...]:
    """The prefix that runs a command in `namespace` (its own addresses and /etc/hosts), under its own host name."""
    prefix: tuple[str, ...] = ("ip", "netns", "exec", namespace)
    if hostname:
        prefix += ("unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname)
    return prefix
