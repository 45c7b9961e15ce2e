"""Record how this rank was started, check a collective, then train like mp_train_equivalence.py.

Usage: mn_probe_train.py OUT_DIR CONFIG [CONFIG ...]

Writes OUT_DIR/probe/rank{R}.json (R = the rank hasten assigned) with the
rank, world size and launcher hasten read from the environment, the
variables a launcher set (torchrun's RANK/GROUP_RANK, Open MPI's
OMPI_COMM_WORLD_*, GLOO_SOCKET_IFNAME chosen by `hasten launch`), and the
results of an all-gather and an all-reduce across the ranks. Then it runs
mp_train_equivalence.py's configurations into OUT_DIR, so the final
parameters can be compared with a single-process run.
"""

import json
import os
import sys
from pathlib import Path

import torch

import mp_train_equivalence
from hasten import Accelerator

RECORDED_VARIABLES = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
    "HASTEN_TEST_MACHINE",  # set by a test on each `hasten launch` it starts: which machine this rank ran on
)


def probe(out_dir: Path) -> None:
    accelerator = Accelerator(cpu=True)
    state = accelerator.state
    rank = accelerator.process_index
    gathered = accelerator.gather(torch.tensor([rank * 10 + 1])).tolist()
    summed = accelerator.reduce(torch.tensor([float(rank + 1)]), "sum").item()
    info = {
        "rank": rank,
        "world_size": accelerator.num_processes,
        "local_rank": accelerator.local_process_index,
        "launcher": state.topology.launcher,
        "node_rank": state.topology.node_rank,
        "backend": state.backend,
        "gathered": gathered,
        "reduced_sum": summed,
        "env": {name: os.environ.get(name) for name in RECORDED_VARIABLES},
        "pid": os.getpid(),
    }
    (out_dir / "probe").mkdir(parents=True, exist_ok=True)
    (out_dir / "probe" / f"rank{rank}.json").write_text(json.dumps(info))


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    probe(out_dir)
    mp_train_equivalence.main()  # reads the same sys.argv: OUT_DIR CONFIG...


if __name__ == "__main__":
    main()
