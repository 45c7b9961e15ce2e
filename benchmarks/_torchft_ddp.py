"""torchft's own DDP example (`train_ddp.py` of its repository), for benchmarks/recovery.py.

The example's wiring unchanged: torchft's Manager, ProcessGroupGloo (5 s timeout), PGTransport, its
DistributedDataParallel and Optimizer wrappers, its DistributedSampler (a shard per replica group) and a
StatefulDataLoader. Two changes, both because of this machine: torchvision does not install beside torch 2.13
here, so CIFAR-10 and its CNN become a synthetic set whose samples carry their index and a small MLP (the harness
counts the samples trained, dropped and trained twice); a benchmark pause (STEP_SLEEP, between steps or, with
SLEEP_AT=mid, before the backward so that a kill lands inside a step).

Prints one line per optimizer step attempt: ``STEP <wall time> <replica> <manager step> <committed> <participants>
<sample ids> <ms>...``.
"""
import logging, os, sys, time
from datetime import timedelta

T0 = time.time()
import torch
T_TORCH = time.time()
from torch import nn, optim
from torchdata.stateful_dataloader import StatefulDataLoader
from torchft import DistributedDataParallel, DistributedSampler, Manager, Optimizer, ProcessGroupGloo
from torchft.checkpointing.pg_transport import PGTransport

logging.basicConfig(level=logging.INFO if os.environ.get("TFLOG") else logging.WARNING)
REPLICA_GROUP_ID = int(os.environ.get("REPLICA_GROUP_ID", 0))
NUM_REPLICA_GROUPS = int(os.environ.get("NUM_REPLICA_GROUPS", 2))
STEPS = int(os.environ.get("STEPS", 150))
SLEEP = float(os.environ.get("STEP_SLEEP", 0.1))
print(f"START {T0:.3f} torch_imported {T_TORCH:.3f} replica {REPLICA_GROUP_ID}", flush=True)

torch.manual_seed(0)
N = 64 * 1000
data = torch.utils.data.TensorDataset(torch.arange(N), torch.randn(N, 16), torch.randn(N, 1))
sampler = DistributedSampler(data, replica_rank=REPLICA_GROUP_ID, num_replica_groups=NUM_REPLICA_GROUPS,
                             group_rank=0, num_replicas=1, shuffle=True)
loader = StatefulDataLoader(data, batch_size=8, num_workers=0, sampler=sampler)
m = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))


def load_state_dict(sd):
    m.load_state_dict(sd["model"]); optimizer.load_state_dict(sd["optim"])


def state_dict():
    return {"model": m.state_dict(), "optim": optimizer.state_dict()}


pg = ProcessGroupGloo(timeout=timedelta(seconds=5))
transport = PGTransport(pg, timeout=timedelta(seconds=10), device="cpu")
manager = Manager(pg=pg, min_replica_size=1, load_state_dict=load_state_dict, state_dict=state_dict,
                  replica_id=f"train_ddp_{REPLICA_GROUP_ID}", timeout=timedelta(seconds=30),
                  checkpoint_transport=transport)
m = DistributedDataParallel(manager, m)
optimizer = Optimizer(manager, optim.AdamW(m.parameters()))
print(f"READY {time.time():.3f}", flush=True)
while True:
    for ids, x, y in loader:
        ta = time.perf_counter()
        optimizer.zero_grad()            # start_quorum (async)
        tb = time.perf_counter()
        loss = nn.functional.mse_loss(m(x), y)
        if os.environ.get("SLEEP_AT") == "mid":
            time.sleep(SLEEP)            # (the benchmark's pause: before the backward, so a kill lands inside a step)
        loss.backward()                  # waits for the quorum, then the allreduce through the manager; errors swallowed
        tc = time.perf_counter()
        before = manager.current_step()
        optimizer.step()                 # should_commit -> step or skip
        td = time.perf_counter()
        committed = manager.current_step() > before
        print(f"STEP {time.time():.3f} {REPLICA_GROUP_ID} {manager.current_step()} {int(committed)} "
              f"{manager.num_participants()} {','.join(map(str, ids.tolist()))} "
              f"{(tb-ta)*1e3:.2f} {(tc-tb)*1e3:.2f} {(td-tc)*1e3:.2f}", flush=True)
        if os.environ.get("SLEEP_AT") != "mid":
            time.sleep(SLEEP)            # (the benchmark's pause: between steps)
        if manager.current_step() >= STEPS:
            manager.shutdown(wait=False)
            sys.stdout.flush()
            os._exit(0)
