"""A few fp8 training steps written for Accelerate, run under it or under hasten (`--lib`); one JSON line per case.

Cases: `default` (mixed_precision="fp8" alone), `emulate` (AORecipeKwargs with an emulating
Float8LinearConfig), `filter` (a custom module filter), `no_all_gather` (FSDP2 gathers weights in
high precision). Each line holds the layers that became Float8Linear, the losses as float.hex, a
digest of the final parameters and the Accelerator's fp8 attributes.
"""

import argparse
import hashlib
import importlib
import json

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--lib", choices=["accelerate", "hasten"], required=True)
parser.add_argument("--cases", default="default", help="comma-separated: default, emulate, filter, no_all_gather")
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--resume-check", metavar="DIR",
                    help="after the digest: save_state to DIR, 2 steps, load_state, the same 2 steps again")
parser.add_argument("--late-optimizer", action="store_true",
                    help="build the optimizer after preparing the model (Accelerate's default fp8 recipe needs it)")
parser.add_argument("--fsdp-fp32", action="store_true",
                    help="an FSDP plugin whose precision policy keeps fp32 (by default fp8 under FSDP computes and "
                         "reduces in bf16, as Accelerate's set_mixed_precision maps it)")
args = parser.parse_args()
lib = importlib.import_module(args.lib)
utils = importlib.import_module(f"{args.lib}.utils")


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down, self.odd = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32), torch.nn.Linear(32, 24)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x))) + self.odd(x).sum(-1, keepdim=True)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(16, 32)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(32, 16)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def recipes(case):
    if case == "emulate":
        from torchao.float8 import Float8LinearConfig

        return [utils.AORecipeKwargs(config=Float8LinearConfig(emulate=True))]
    if case == "no_all_gather":
        return [utils.AORecipeKwargs(enable_fsdp_float8_all_gather=False)]
    if case == "filter":
        return [utils.AORecipeKwargs(module_filter_func=lambda module, fqn: fqn.endswith("up"))]
    return []


def run(case):
    plugin = None
    if args.fsdp_fp32:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        plugin = utils.FullyShardedDataParallelPlugin(
            fsdp_version=2, mixed_precision_policy=MixedPrecisionPolicy(param_dtype=torch.float32,
                                                                        reduce_dtype=torch.float32))
    accelerator = lib.Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=recipes(case), fsdp_plugin=plugin)
    fsdp = getattr(accelerator.state, "fsdp_plugin", None)
    policy = getattr(getattr(fsdp, "mixed_precision_policy", None), "param_dtype", None)
    torch.manual_seed(0)
    model = Net()
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    n = 8 * args.steps * accelerator.num_processes
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(n, 16), torch.randn(n, 16)),
                                         batch_size=8)
    if args.late_optimizer:
        model = accelerator.prepare(model)
        optimizer, loader = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=1e-3), loader)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    # The local tensor type of the converted weights: torchao's float8 all-gather wraps them.
    weights = sorted({type(getattr(m.weight, "_local_tensor", m.weight)).__name__ for m in model.modules()
                      if type(m).__name__ == "Float8Linear"})
    losses = []
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(accelerator.reduce(loss.detach(), "mean")).hex())
    state = accelerator.get_state_dict(model)
    digest = hashlib.sha256()
    frozen = []  # parameters the optimizer never moved
    for name in sorted(state):
        tensor = getattr(state[name], "_tensor", state[name]).detach()  # the float8 all-gather weight wraps a tensor
        digest.update(name.encode() + tensor.float().contiguous().numpy().tobytes())
        if torch.equal(tensor, initial[name]):
            frozen.append(name)
    converted = sorted(n for n, m in accelerator.unwrap_model(model).named_modules() if type(m).__name__ == "Float8Linear")
    config = accelerator.ao_recipe_handler.config
    resumed = None
    if args.resume_check:
        def step():
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            return float(accelerator.reduce(loss.detach(), "mean")).hex()

        accelerator.save_state(args.resume_check)
        after_save = [step(), step()]
        accelerator.load_state(args.resume_check)
        resumed = [step(), step()] == after_save
    if accelerator.is_main_process:
        print(json.dumps({"case": case, "converted": converted, "frozen": frozen, "resumed": resumed, "losses": losses, "params": digest.hexdigest(),
                          "backend": str(accelerator.fp8_backend.value), "enabled": accelerator.fp8_enabled,
                          "emulate": config.emulate, "all_gather": config.enable_fsdp_float8_all_gather,
                          "pad_inner_dim": config.pad_inner_dim, "mixed_precision": accelerator.mixed_precision,
                          "processes": accelerator.num_processes, "weights": weights, "policy": str(policy),
                          "distributed_type": str(accelerator.distributed_type.value)}), flush=True)
    return accelerator


cases = args.cases.split(",")
for i, case in enumerate(cases):
    accelerator = run(case)
    if i + 1 < len(cases):
        accelerator.free_memory()
        importlib.import_module(f"{args.lib}.state").AcceleratorState._reset_state(True)
accelerator.end_training()
