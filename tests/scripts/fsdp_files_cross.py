"""A sharded FSDP checkpoint written by one library, read by the other (`test_checkpoint_accelerate.py`).

    python fsdp_files_cross.py save <hasten|accelerate> OUT   # train one AdamW step, save model + optimizer with DCP
    python fsdp_files_cross.py load <hasten|accelerate> OUT   # load them into fresh objects, compare with OUT/ref.pt
    python fsdp_files_cross.py save-unwrapped hasten OUT      # the layout hasten wrote before 1.15 (state at the top)

One process, no process group: both libraries' `save_fsdp_model` then take
DCP's single-process path; the files inside are what a sharded run writes.
The only difference between the libraries is the import line.
"""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

mode, library, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
if library == "accelerate":
    from accelerate import PartialState
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import load_fsdp_model, load_fsdp_optimizer, save_fsdp_model, save_fsdp_optimizer
else:
    from hasten import PartialState
    from hasten.utils import FullyShardedDataParallelPlugin
    from hasten.utils.fsdp_utils import load_fsdp_model, load_fsdp_optimizer, save_fsdp_model, save_fsdp_optimizer

PartialState(cpu=True)
plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
processes = SimpleNamespace(num_processes=1, process_index=0, is_main_process=True, wait_for_everyone=lambda: None)


def fresh(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


if mode.startswith("save"):
    model, optimizer = fresh(0)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    if mode == "save-unwrapped":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        dcp.save(get_model_state_dict(model), checkpoint_id=out / "pytorch_model_fsdp_0")
        dcp.save(get_optimizer_state_dict(model, optimizer), checkpoint_id=out / "optimizer_0")
    else:
        save_fsdp_model(plugin, processes, model, out)
        save_fsdp_optimizer(plugin, processes, optimizer, model, out)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, out / "ref.pt")
else:
    model, optimizer = fresh(1)  # other weights, and no optimizer state yet
    load_fsdp_model(plugin, processes, model, out)
    load_fsdp_optimizer(plugin, processes, optimizer, model, out)
    ref = torch.load(out / "ref.pt", weights_only=True)
    weights = all(torch.equal(v, model.state_dict()[k]) for k, v in ref["model"].items())
    state = optimizer.state_dict()["state"]
    moments = all(torch.equal(v, state[i][k]) for i, saved in ref["optimizer"]["state"].items() for k, v in saved.items())
    print(json.dumps({"weights": weights, "moments": moments, "steps": sorted(int(s["step"]) for s in state.values())}))
