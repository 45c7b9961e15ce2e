"""Train a tiny denoiser with Accelerate the way diffusers' example scripts do, checkpoints saved by the main process.

A client written here in the style of diffusers'
``examples/unconditional_image_generation/train_unconditional.py``: noise
and timesteps drawn from the global RNG each step, ``accelerator.accumulate``,
``clip_grad_norm_`` on sync steps, a cosine schedule with warm-up,
``save_state`` called inside ``if accelerator.is_main_process:`` every
``--checkpointing_steps`` optimizer steps, and save/load hooks that write
the model in a ``unet/`` subfolder, registered only when
``accelerate.__version__ >= 0.16.0`` (as those scripts check).
``--resume_from_checkpoint latest`` continues from the newest checkpoint,
skipping the batches already done. The hooks are written as diffusers'
scripts write them: they call ``save_pretrained`` on the models they
receive and load with ``from_pretrained`` + ``register_to_config`` +
``load_state_dict`` (no ``unwrap_model``), so they need what Accelerate
hands them: the bare model, also under DDP.

The model is a small convolutional net with ``save_pretrained`` /
``from_pretrained`` / ``register_to_config`` in diffusers' folder layout
(``config.json`` + ``diffusion_pytorch_model.safetensors``), so diffusers need
not be installed; ``--diffusers_unet`` trains diffusers' own tiny
``UNet2DModel`` instead (run it unchanged under hasten's accelerate switch, so
diffusers itself gets hasten too).

Run it::

    python diffusers_client.py --out OUT --cpu
    python diffusers_client.py --out OUT2 --cpu --resume_from_checkpoint latest --checkpoints OUT

Example:
    >>> TinyUNet().config["channels"]
    8
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os

import torch
import torch.nn.functional as F
from packaging import version
from safetensors.torch import load_file, save_file
from torch.utils.data import DataLoader, Dataset
from transformers import get_scheduler

import accelerate
from accelerate import Accelerator
from accelerate.utils import set_seed


class TinyUNet(torch.nn.Module):
    """A denoiser with diffusers' save/load layout: ``config.json`` and ``diffusion_pytorch_model.safetensors``."""

    def __init__(self, channels=8, timesteps=50):
        super().__init__()
        self.config = {"channels": channels, "timesteps": timesteps}
        self.embed = torch.nn.Embedding(timesteps, channels)
        self.conv_in = torch.nn.Conv2d(1, channels, 3, padding=1)
        self.dropout = torch.nn.Dropout(0.1)
        self.conv_out = torch.nn.Conv2d(channels, 1, 3, padding=1)

    def forward(self, x, t):
        h = F.silu(self.conv_in(x) + self.embed(t)[:, :, None, None])
        return self.conv_out(self.dropout(h))

    def register_to_config(self, **config):
        self.config.update(config)

    def save_pretrained(self, folder):
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(self.config, f)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()},
                  os.path.join(folder, "diffusion_pytorch_model.safetensors"))

    @classmethod
    def from_pretrained(cls, folder, subfolder=""):
        folder = os.path.join(folder, subfolder)
        with open(os.path.join(folder, "config.json")) as f:
            model = cls(**json.load(f))
        model.load_state_dict(load_file(os.path.join(folder, "diffusion_pytorch_model.safetensors")))
        return model


class Images(Dataset):
    def __init__(self, n=40, size=8):
        g = torch.Generator().manual_seed(0)
        self.images = torch.rand(n, 1, size, size, generator=g) * 2 - 1

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return {"input": self.images[i], "idx": i}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="tiny unconditional denoiser")
    parser.add_argument("--out", required=True, help="records go here; so do the checkpoints (OUT/checkpoint-N)")
    parser.add_argument("--checkpoints", default=None, help="where --resume_from_checkpoint looks (default: --out)")
    parser.add_argument("--train_batch_size", type=int, default=4)
    parser.add_argument("--num_epochs", type=int, default=2)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--lr_warmup_steps", type=int, default=2)
    parser.add_argument("--checkpointing_steps", type=int, default=2)
    parser.add_argument("--resume_from_checkpoint", default=None, help="a checkpoint-N folder name, or 'latest'")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--num_train_timesteps", type=int, default=50)
    parser.add_argument("--diffusers_unet", action="store_true", help="train diffusers' UNet2DModel (tiny)")
    return parser.parse_args(argv)


def main():
    args = parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps, cpu=args.cpu)
    os.makedirs(args.out, exist_ok=True)
    records = open(os.path.join(args.out, f"records_rank{accelerator.process_index}.jsonl"), "a")

    def record(**fields):
        records.write(json.dumps(fields) + "\n")
        records.flush()

    model_class = TinyUNet
    if args.diffusers_unet:
        from diffusers import UNet2DModel as model_class

    if version.parse(accelerate.__version__) >= version.parse("0.16.0"):
        def save_model_hook(models, weights, output_dir):
            if accelerator.is_main_process:
                for i, model in enumerate(models):
                    model.save_pretrained(os.path.join(output_dir, "unet"))
                    # make sure to pop weight so that corresponding model is not saved again
                    weights.pop()

        def load_model_hook(models, input_dir):
            for i in range(len(models)):
                # pop models so that they are not loaded again
                model = models.pop()
                # load diffusers style into model
                load_model = model_class.from_pretrained(input_dir, subfolder="unet")
                model.register_to_config(**load_model.config)
                model.load_state_dict(load_model.state_dict())
                del load_model

        accelerator.register_save_state_pre_hook(save_model_hook)
        accelerator.register_load_state_pre_hook(load_model_hook)
    record(k="setup", hooks=version.parse(accelerate.__version__) >= version.parse("0.16.0"))

    set_seed(args.seed)
    if args.diffusers_unet:  # diffusers' own model, tiny
        model = model_class(sample_size=8, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(8, 16),
                            down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
                            norm_num_groups=4)
    else:
        model = TinyUNet(timesteps=args.num_train_timesteps)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=1e-2)
    train_dataloader = DataLoader(Images(), batch_size=args.train_batch_size, shuffle=True)
    lr_scheduler = get_scheduler("cosine", optimizer=optimizer,
                                 num_warmup_steps=args.lr_warmup_steps * args.gradient_accumulation_steps,
                                 num_training_steps=len(train_dataloader) * args.num_epochs)
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler)
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)

    global_step = first_epoch = resume_step = 0
    if args.resume_from_checkpoint:
        folder = args.checkpoints or args.out
        if args.resume_from_checkpoint == "latest":
            names = sorted((d for d in os.listdir(folder) if d.startswith("checkpoint")),
                           key=lambda d: int(d.split("-")[1]))
            path = names[-1]
        else:
            path = os.path.basename(args.resume_from_checkpoint)
        accelerator.load_state(os.path.join(folder, path))
        global_step = int(path.split("-")[1])
        resume_global_step = global_step * args.gradient_accumulation_steps
        first_epoch = global_step // num_update_steps_per_epoch
        resume_step = resume_global_step % (num_update_steps_per_epoch * args.gradient_accumulation_steps)
        record(k="loaded", path=path, lr=float(lr_scheduler.get_last_lr()[0]).hex())

    for epoch in range(first_epoch, args.num_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            if args.resume_from_checkpoint and epoch == first_epoch and step < resume_step:
                continue  # batches done before the checkpoint
            rng = hashlib.sha1(torch.get_rng_state().numpy().tobytes()).hexdigest()[:10]
            clean_images = batch["input"]
            noise = torch.randn(clean_images.shape).to(clean_images.device)
            timesteps = torch.randint(0, args.num_train_timesteps, (clean_images.shape[0],), device=clean_images.device)
            alpha = (1 - timesteps.float() / args.num_train_timesteps)[:, None, None, None]
            noisy_images = alpha.sqrt() * clean_images + (1 - alpha).sqrt() * noise

            norm = None
            with accelerator.accumulate(model):
                noise_pred = model(noisy_images, timesteps)
                noise_pred = getattr(noise_pred, "sample", noise_pred)  # diffusers' models return an output object
                loss = F.mse_loss(noise_pred, noise)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()

            record(k="step", ep=epoch, st=step, idx=batch["idx"].tolist(), rng=rng, loss=loss.item().hex(),
                   lr=float(lr_scheduler.get_last_lr()[0]).hex(), sync=accelerator.sync_gradients,
                   eod=accelerator.gradient_state.end_of_dataloader,
                   norm=None if norm is None else float(norm).hex())
            if accelerator.sync_gradients:
                global_step += 1
                if accelerator.is_main_process and global_step % args.checkpointing_steps == 0:
                    save_path = os.path.join(args.out, f"checkpoint-{global_step}")
                    accelerator.save_state(save_path)
                    record(k="saved", ep=epoch, st=step, path=os.path.basename(save_path), step=global_step)
        accelerator.wait_for_everyone()

    final = {n: float(p.detach().double().sum()).hex() for n, p in accelerator.unwrap_model(model).named_parameters()}
    record(k="final", params=final)
    accelerator.wait_for_everyone()
    record(k="done")
    accelerator.end_training()



if __name__ == "__main__":
    main()
