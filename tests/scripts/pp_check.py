"""Pipeline parallel (2 stages) against the unsplit model, in every process: inference and training.

Usage: pp_check.py OUT_DIR    (launched with 2 processes; writes OUT_DIR/rank{N}.json)

Every process builds the same model from one seed and keeps an unsplit copy
as the reference. Checks: prepare_pippy outputs (GPipe; "auto" split;
gather_output; a padded smaller batch; an explicit split without gathering;
keyword inputs with a dict output), and for GPipe and 1F1B (on the dict-output
model) training the loss and every parameter's gradient of this process's
stage over two optimizer steps.
"""

import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from hasten import PartialState
from hasten.strategies.parallel import build_pipeline, pippy_forward, prepare_pippy
from hasten.strategies.parallel import prepare_pipeline_training


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(width, width)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(6, 16)
        self.blocks = torch.nn.ModuleList([Block(16) for _ in range(4)])
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class DictNet(Net):
    """Keyword inputs and a dict output, like transformers models."""

    def forward(self, x, mask=None):
        return {"logits": super().forward(x if mask is None else x * mask)}


def max_diff(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


def main(out: Path) -> None:
    state = PartialState(cpu=True)
    rank = state.process_index
    torch.manual_seed(0)
    reference = Net()
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(8, 6, generator=generator)
    y = torch.randn(8, 3, generator=generator)
    result = {"rank": rank}

    # -- inference ------------------------------------------------------------
    with torch.no_grad():
        expected = reference(x)
        piped = prepare_pippy(copy.deepcopy(reference), split_points="auto", example_args=(x,), gather_output=True)
        result["auto_split_points"] = piped.hf_split_points
        result["infer_gathered"] = max_diff(piped(x), expected)
        result["infer_padded"] = max_diff(piped(x[:5]), expected[:5])  # padded to 8, cut back to 5
        piped = prepare_pippy(copy.deepcopy(reference), split_points=["blocks.2"], example_args=(x,), num_chunks=4)
        out_last = piped(x)
        result["infer_last_is_none"] = out_last is None
        result["infer_last"] = None if out_last is None else max_diff(out_last, expected)
        # the original model object is untouched by the split annotations
        result["reference_untouched"] = max_diff(reference(x), expected)
        # keyword inputs and a dict output keep their structure
        torch.manual_seed(0)
        dict_net = DictNet()
        mask = (torch.arange(6) < 4).float().expand(8, 6)
        expected = dict_net(x, mask=mask)["logits"]
        piped = prepare_pippy(dict_net, example_kwargs={"x": x, "mask": mask}, gather_output=True)
        dict_out = piped(x=x[:6], mask=mask[:6])
        result["infer_dict"] = (max_diff(dict_out["logits"], expected[:6]) if isinstance(dict_out, dict)
                                else repr(type(dict_out)))
        # Accelerate's lower-level parts: a schedule traced on one row, called with 2 rows (one per micro-batch)
        schedule = build_pipeline(copy.deepcopy(reference), ["blocks.2"], (x[:1],), None, num_chunks=2)
        result["pippy_forward"] = max_diff(pippy_forward(schedule.step, 2, True, x[:2]), reference(x[:2]))

    # -- training ----------------------------------------------------------------
    for schedule in ("gpipe", "1f1b"):
        if schedule == "1f1b":  # also: a dict output reaches loss_fn as a dict
            torch.manual_seed(0)
            reference = DictNet()

            def loss_fn(output, target):
                return torch.nn.functional.mse_loss(output["logits"], target)
        else:
            loss_fn = torch.nn.functional.mse_loss
        ref_model = copy.deepcopy(reference)
        trainer = prepare_pipeline_training(copy.deepcopy(reference), ["blocks.2"], example_args=(x,),
                                            loss_fn=loss_fn, num_chunks=4, schedule=schedule)
        ref_optimizer = torch.optim.SGD(ref_model.parameters(), lr=0.1)
        optimizer = torch.optim.SGD(trainer.parameters(), lr=0.1)
        ref_params = dict(ref_model.named_parameters())
        info = {"names": sorted(n for n, _ in trainer.named_parameters()), "loss": [], "grad": []}
        for _ in range(2):  # the second step checks the stages' optimizer updates too
            ref_loss = loss_fn(ref_model(x), y)
            ref_loss.backward()
            loss = trainer.step(x, target=y)
            info["loss"].append(abs(loss.item() - ref_loss.item()))
            info["grad"].append(max(max_diff(p.grad, ref_params[n].grad) for n, p in trainer.named_parameters()))
            ref_optimizer.step()
            optimizer.step()
            ref_optimizer.zero_grad()
            optimizer.zero_grad()
        info["loss_value"] = loss.item()
        result[schedule] = info

    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
