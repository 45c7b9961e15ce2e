"""Context parallel (cp 2, with dp_shard 2 on 4 processes) on CPU against the 1-process model, in every process.

Usage: cp_train.py OUT_DIR    (2 processes: cp 2; 4: dp_shard 2 x cp 2; 8: dp_replicate 2 x dp_shard 2 x cp 2)
       CP_DEVICE=cuda ... runs it on one GPU per process through torch's ring attention (needs >= 2 GPUs).

Every process builds the same tiny causal LM from one seed and keeps an
unsplit copy as the reference (full sequence, real causal mask, no CP). The
prepared copy runs one step inside `accelerator.maybe_context_parallel` on
this rank's load-balanced slice; its loss averaged over
``torch_device_mesh["dp_cp"]`` and its gradients (gathered from FSDP2 shards)
are compared with the reference's. Then a resume check: AdamW trains 4 steps under
`maybe_context_parallel`, saving its state after step 2; a second Accelerator with
a model built from another seed loads that state and trains steps 3-4; both end
with the same parameters. Writes OUT_DIR/rank{N}.json.
"""

import copy
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from hasten import Accelerator
from hasten.parallelism_config import ParallelismConfig
from hasten.strategies.parallel.context import load_balanced_positions

VOCAB, WIDTH, HEADS, MAX_LEN = 16, 8, 2, 16


class SelfAttention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(WIDTH, 3 * WIDTH)
        self.out = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x, attention_mask=None, is_causal=False):
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, is_causal=is_causal)
        return self.out(y.transpose(1, 2).reshape(batch, seq, WIDTH))


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = SelfAttention()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(WIDTH, 16), torch.nn.GELU(), torch.nn.Linear(16, WIDTH))

    def forward(self, x, attention_mask):
        x = x + self.self_attn(x, attention_mask=attention_mask)
        return x + self.mlp(x)


class TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.position = torch.nn.Embedding(MAX_LEN, WIDTH)
        self.layers = torch.nn.ModuleList([Block() for _ in range(2)])
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, input_ids, position_ids, labels):
        x = self.embed(input_ids) + self.position(position_ids)
        seq = input_ids.shape[1]
        # the real causal mask (as an HF model builds one); prepare's hook swaps it for is_causal=True under CP
        mask = torch.ones(seq, seq, dtype=torch.bool, device=x.device).tril()
        for layer in self.layers:
            x = layer(x, mask)
        return F.cross_entropy(self.head(x).flatten(0, 1), labels.flatten())


def full_grads(model):
    return {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach()
            for n, p in model.named_parameters()}


def batch_of(seq, seed, rows=2):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (rows, seq + 1), generator=g)
    return ids[:, :-1].clone(), torch.arange(seq).expand(rows, seq).clone(), ids[:, 1:].clone()  # labels pre-shifted


def make_accelerator(dp: int) -> Accelerator:
    replicate = 2 if dp >= 4 else 1  # 8 processes: HSDP (2 x 2) x cp 2
    return Accelerator(cpu=os.environ.get("CP_DEVICE", "cpu") == "cpu",
                       parallelism_config=ParallelismConfig(dp_replicate_size=replicate, dp_shard_size=dp // replicate,
                                                            cp_size=2))


def full_params(model) -> dict:
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for n, p in model.named_parameters()}


def resume(dp: int, directory: Path) -> dict:
    """Train 4 steps saving after step 2; a fresh run loads that state and trains steps 3-4: the same parameters."""
    def build(seed):
        accelerator = make_accelerator(dp)
        torch.manual_seed(seed)
        model = TinyLM()
        model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
        return accelerator, model, optimizer

    def train(accelerator, model, optimizer, steps):
        dp_rank = accelerator.parallelism_config.submesh("dp").get_local_rank() if dp > 1 else 0
        for step in steps:
            rows = (t[2 * dp_rank:2 * dp_rank + 2].clone().to(accelerator.device) for t in batch_of(8, 10 + step, 2 * dp))
            ids, positions, labels = rows
            with accelerator.maybe_context_parallel(buffers=[ids, positions, labels], buffer_seq_dims=[1, 1, 1],
                                                    no_restore_buffers={labels}):
                accelerator.backward(model(ids, positions, labels))
            optimizer.step()
            optimizer.zero_grad()

    accelerator, model, optimizer = build(0)
    train(accelerator, model, optimizer, range(2))
    accelerator.save_state(str(directory))
    train(accelerator, model, optimizer, range(2, 4))
    uninterrupted = full_params(model)
    accelerator, model, optimizer = build(1)  # other weights: everything must come from the checkpoint
    accelerator.load_state(str(directory))
    train(accelerator, model, optimizer, range(2, 4))
    resumed = full_params(model)
    return {"bitwise": all(torch.equal(resumed[n], p) for n, p in uninterrupted.items()),
            "max_diff": max((resumed[n] - p).abs().max().item() for n, p in uninterrupted.items())}


def main(out: Path) -> None:
    dp = int(os.environ["WORLD_SIZE"]) // 2  # cp 2 on 2 processes; dp_shard 2 x cp 2 on 4
    accelerator = make_accelerator(dp)
    device = accelerator.device
    rank = accelerator.process_index
    torch.manual_seed(0)
    model = TinyLM()
    reference = copy.deepcopy(model).to(device)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    mesh = accelerator.torch_device_mesh
    loss_group = mesh["dp_cp"].get_group()
    cp_rank = mesh["cp"].get_local_rank()
    dp_rank = accelerator.parallelism_config.submesh("dp").get_local_rank() if dp > 1 else 0
    report = {"mesh": list(mesh.mesh_dim_names), "dp_cp_size": mesh["dp_cp"].size(), "dp_rank": dp_rank}

    # the loader: CP ranks read the same batches
    loader = accelerator.prepare(torch.utils.data.DataLoader(torch.arange(8), batch_size=2))
    report["batches"] = [b.tolist() for b in loader]

    for step, seq in enumerate((8, 6)):  # 8: head-tail balanced; 6 (not a multiple of 4): contiguous slices
        # the reference reads every data-parallel group's rows at once; this process reads its group's 2 rows
        everything = tuple(t.to(device) for t in batch_of(seq, step, rows=2 * dp))
        ids, positions, labels = (t[2 * dp_rank:2 * dp_rank + 2].clone() for t in everything)
        full_ids, full_labels = ids.clone(), labels.clone()
        ref_opt.zero_grad()
        ref_loss = reference(*everything)
        ref_loss.backward()
        ref_opt.step()
        with accelerator.maybe_context_parallel(buffers=[ids, positions, labels], buffer_seq_dims=[1, 1, 1],
                                                no_restore_buffers={labels}):
            inside = ids.shape[1]
            loss = model(ids, positions, labels)
            accelerator.backward(loss)
        grads = full_grads(model)
        ref = {n: p.grad for n, p in reference.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss, group=loss_group)
        mean_loss /= dist.get_world_size(loss_group)
        params = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach() for n, p in model.named_parameters()}
        report[f"seq{seq}"] = {
            "tokens_inside": inside,
            "ids_restored": bool(ids.shape == full_ids.shape and torch.equal(ids, full_ids)),
            "labels_kept_sharded": labels.shape[1],
            "labels_are_my_slice": bool(torch.equal(labels, full_labels[:, load_balanced_positions(seq, 2, cp_rank).to(device)])),
            "loss_diff": abs(mean_loss.item() - ref_loss.item()),
            "local_loss_differs": abs(loss.item() - ref_loss.item()),
            "grad_max_diff": max((grads[n] - ref[n]).abs().max().item() for n in ref),
            "param_max_diff": max((params[n] - p).abs().max().item() for n, p in reference.named_parameters()),
        }
    report["resume"] = resume(dp, out / "ckpt")
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
