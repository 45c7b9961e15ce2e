"""Load tiny diffusers models and pipelines through Accelerate's big-model code: no line of Accelerate here.

diffusers imports Accelerate itself (``init_empty_weights``,
``infer_auto_device_map``, ``get_balanced_memory``, ``dispatch_model``,
``set_module_tensor_to_device``, ``offload_weight``, the hooks,
``cpu_offload`` / ``cpu_offload_with_hook``). Under hasten the same file
runs after ``import hasten.as_accelerate`` (``--switch``), which serves
``import accelerate`` from hasten.

It builds, from configs (nothing is downloaded), a tiny ``UNet2DModel`` +
``DDPMScheduler`` saved as a ``DDPMPipeline`` folder, a ``DiTPipeline``
(transformer + VAE) and a tiny ``UNet2DConditionModel``, then loads and
offloads them the ways diffusers offers with Accelerate and records what
came out: images and outputs (``float.hex``
sums and exact bytes digests, the arrays in ``OUT/arrays.npz``), the device
maps, the hooks on the modules, the parameter devices and the files written
to the offload folders. ``OUT/result.json`` holds the record.

Run it::

    python diffusers_loading_client.py --out OUT            # on Accelerate
    python diffusers_loading_client.py --out OUT --switch   # on hasten

Example:
    >>> parse_args(["--out", "o"]).steps
    3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import traceback


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="diffusers loading through Accelerate's big-model code")
    parser.add_argument("--out", required=True, help="result.json and arrays.npz go here")
    parser.add_argument("--switch", action="store_true", help="import hasten.as_accelerate first")
    parser.add_argument("--steps", type=int, default=3, help="denoising steps of the pipeline runs")
    parser.add_argument("--device", default="cpu", help="the execution device for the offload cases")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.switch:
        import hasten.as_accelerate  # noqa: F401  (before diffusers, so it sees Accelerate)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import numpy as np
    import torch
    import diffusers
    from diffusers import (AutoencoderKL, DDIMScheduler, DDPMPipeline, DDPMScheduler, DiTPipeline,
                           DiTTransformer2DModel, UNet2DConditionModel, UNet2DModel)

    accelerate = sys.modules["accelerate"]  # imported by diffusers; here only to record which library served it

    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="diffusers-loading-")
    result: dict = {"accelerate": accelerate.__version__, "served_by": accelerate.Accelerator.__module__,
                    "diffusers": diffusers.__version__, "cases": {}}
    arrays: dict = {}

    def digest(array) -> dict:
        array = np.ascontiguousarray(np.asarray(array, dtype=np.float32))
        return {"shape": list(array.shape), "sum": float(array.astype(np.float64).sum()).hex(),
                "sha": hashlib.sha1(array.tobytes()).hexdigest()[:16]}

    def hooks_of(model) -> dict:
        found = {}
        for name, module in model.named_modules():
            hook = getattr(module, "_hf_hook", None)
            if hook is None:
                continue
            inner = getattr(hook, "hooks", None)
            kinds = [type(h).__name__ for h in inner] if inner is not None else [type(hook).__name__]
            described = []
            for kind, h in zip(kinds, inner if inner is not None else [hook]):
                fields = {k: str(getattr(h, k)) for k in ("execution_device", "offload", "io_same_device",
                                                          "offload_buffers", "place_submodules")
                          if hasattr(h, k)}
                described.append([kind, fields])
            found[name] = described
        return found

    def placement(model) -> dict:
        return {name: str(p.device) for name, p in model.named_parameters()}

    def files_in(folder) -> list:
        if not os.path.isdir(folder):
            return []
        return sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs)

    def case(name):
        def wrap(fn):
            try:
                result["cases"][name] = {"ok": True, **fn()}
            except Exception as error:  # a refusal is a result too: both libraries must refuse alike
                result["cases"][name] = {"ok": False, "error": type(error).__name__,
                                         "message": str(error).splitlines()[0][:300]}
                traceback.print_exc()
            return fn
        return wrap

    # The models, built from configs with a fixed seed and saved in diffusers' folder layout.
    torch.manual_seed(0)
    unet = UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
                       block_out_channels=(32, 64), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8)
    pipeline_dir = os.path.join(work, "ddpm")
    DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=50)).save_pretrained(pipeline_dir)
    torch.manual_seed(1)
    cond = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                                block_out_channels=(32, 64), cross_attention_dim=16, attention_head_dim=8,
                                norm_num_groups=8,
                                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))
    cond_dir = os.path.join(work, "cond")
    cond.save_pretrained(cond_dir)
    cond_size = sum(p.numel() * p.element_size() for p in cond.parameters())
    result["cond_bytes"] = cond_size

    g = torch.Generator().manual_seed(3)
    cond_inputs = (torch.randn(2, 4, 8, 8, generator=g), torch.tensor([3, 7]), torch.randn(2, 5, 16, generator=g))
    unet_inputs = (torch.randn(2, 3, 8, 8, generator=g), torch.tensor([1, 4]))

    def run_pipeline(pipe, key):
        images = pipe(batch_size=2, generator=torch.Generator().manual_seed(0), num_inference_steps=args.steps,
                      output_type="np").images
        arrays[key] = np.asarray(images, dtype=np.float32)
        return digest(images)

    def forward(model, inputs, key):
        device = next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))
        with torch.no_grad():
            out = model(*(x.to(device) for x in inputs)).sample
        arrays[key] = out.detach().cpu().float().numpy()
        return digest(arrays[key])

    def pipeline_case(device_map):
        pipe = DDPMPipeline.from_pretrained(pipeline_dir, device_map=device_map)
        record = {"hf_device_map": str(pipe.hf_device_map), "mapped": pipe._is_pipeline_device_mapped(),
                  "hooks": hooks_of(pipe.unet), "placement": sorted(set(placement(pipe.unet).values())),
                  "images": run_pipeline(pipe, f"pipeline_{device_map}")}
        pipe.reset_device_map()
        return {**record, "after_reset": [str(pipe.hf_device_map), hooks_of(pipe.unet)]}

    for device_map in sorted({"cpu", "balanced", args.device}):
        case(f"pipeline_device_map_{device_map}")(lambda device_map=device_map: pipeline_case(device_map))

    @case("pipeline_reference")
    def _():
        pipe = DDPMPipeline.from_pretrained(pipeline_dir, low_cpu_mem_usage=False)
        return {"images": run_pipeline(pipe, "pipeline_reference")}

    @case("pipeline_low_cpu_mem_usage")
    def _():
        pipe = DDPMPipeline.from_pretrained(pipeline_dir, low_cpu_mem_usage=True)
        return {"hooks": hooks_of(pipe.unet), "images": run_pipeline(pipe, "pipeline_low_cpu_mem_usage")}

    @case("pipeline_model_cpu_offload")
    def _():
        pipe = DDPMPipeline.from_pretrained(pipeline_dir)
        pipe.enable_model_cpu_offload(device=args.device)
        hooks = hooks_of(pipe.unet)
        images = run_pipeline(pipe, "pipeline_model_cpu_offload")
        return {"hooks": hooks, "hooks_after_run": hooks_of(pipe.unet), "images": images,
                "placement_after": sorted(set(placement(pipe.unet).values())),
                "execution_device": str(pipe._execution_device), "n_hooks": len(pipe._all_hooks)}

    @case("pipeline_model_cpu_offload_refused_without_device")
    def _():
        pipe = DDPMPipeline.from_pretrained(pipeline_dir)
        pipe.enable_model_cpu_offload()
        return {"images": run_pipeline(pipe, "pipeline_model_cpu_offload_nodevice")}

    @case("pipeline_sequential_cpu_offload")
    def _():
        pipe = DDPMPipeline.from_pretrained(pipeline_dir)
        pipe.enable_sequential_cpu_offload(device=args.device)
        hooks = hooks_of(pipe.unet)
        placed = sorted(set(placement(pipe.unet).values()))
        images = run_pipeline(pipe, "pipeline_sequential_cpu_offload")
        pipe.remove_all_hooks()
        return {"hooks": hooks, "placement": placed, "images": images,
                "execution_device": str(pipe._execution_device), "hooks_removed": hooks_of(pipe.unet)}

    # A two-model pipeline (transformer -> vae): chained offload hooks, and vae.decode through apply_forward_hook.
    torch.manual_seed(2)
    dit = DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8,
                                num_layers=1, norm_num_groups=8, sample_size=4, patch_size=2)
    vae = AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=(8, 16), latent_channels=4,
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                        norm_num_groups=8, sample_size=8)
    dit_dir = os.path.join(work, "dit")
    DiTPipeline(transformer=dit, vae=vae, scheduler=DDIMScheduler(num_train_timesteps=50)).save_pretrained(dit_dir)

    def run_dit(pipe, key):
        images = pipe(class_labels=[1, 2], generator=torch.Generator().manual_seed(0), num_inference_steps=args.steps,
                      output_type="np").images
        arrays[key] = np.asarray(images, dtype=np.float32)
        return digest(images)

    @case("dit_reference")
    def _():
        return {"images": run_dit(DiTPipeline.from_pretrained(dit_dir), "dit_reference")}

    @case("dit_device_map_balanced")
    def _():
        pipe = DiTPipeline.from_pretrained(dit_dir, device_map="balanced")
        return {"hf_device_map": str(pipe.hf_device_map), "images": run_dit(pipe, "dit_balanced"),
                "placement": sorted(set(placement(pipe.transformer).values()) | set(placement(pipe.vae).values()))}

    @case("dit_model_cpu_offload")
    def _():
        pipe = DiTPipeline.from_pretrained(dit_dir)
        pipe.enable_model_cpu_offload(device=args.device)
        chained = pipe.vae._hf_hook.prev_module_hook is not None and pipe.transformer._hf_hook.prev_module_hook is None
        images = run_dit(pipe, "dit_model_cpu_offload")
        return {"hooks": [type(m._hf_hook).__name__ for m in (pipe.transformer, pipe.vae)], "chained": chained,
                "images": images, "after": [str(pipe.transformer.device), str(pipe.vae.device)]}

    @case("components_manager_offload_hooks")
    def _():
        # diffusers' own ModelHook subclass attached through Accelerate's add_hook_to_module (duck-typed hooks)
        from diffusers.modular_pipelines.components_manager import custom_offload_with_hook

        first = UNet2DModel.from_pretrained(pipeline_dir, subfolder="unet")
        second = UNet2DConditionModel.from_pretrained(cond_dir)
        hooks = [custom_offload_with_hook("unet", first, args.device),
                 custom_offload_with_hook("cond", second, args.device)]
        hooks[0].add_other_hook(hooks[1])
        hooks[1].add_other_hook(hooks[0])
        outs = [forward(first, unet_inputs, "components_unet"), str(first.device), str(second.device),
                forward(second, cond_inputs, "components_cond"), str(first.device), str(second.device)]
        kinds = [type(getattr(m, "_hf_hook", None)).__name__ for m in (first, second)]
        for hook in hooks:
            hook.remove()
        return {"outs": outs, "hooks": kinds, "after_remove": [hasattr(m, "_hf_hook") for m in (first, second)],
                "forward_restored": [m.forward.__func__ is type(m).forward for m in (first, second)]}

    @case("unet_group_offload")
    def _():
        # diffusers' own offloading: its hooks send inputs with Accelerate's send_to_device
        model = UNet2DModel.from_pretrained(pipeline_dir, subfolder="unet")
        model.enable_group_offload(onload_device=torch.device(args.device), offload_type="leaf_level")
        return {"out": forward(model, unet_inputs, "unet_group_offload")}

    @case("group_offload_refused_over_accelerate_hooks")
    def _():
        # diffusers refuses when it finds Accelerate's AlignDevicesHook / CpuOffload on a module
        pipe = DDPMPipeline.from_pretrained(pipeline_dir)
        pipe.enable_model_cpu_offload(device=args.device)
        pipe.unet.enable_group_offload(onload_device=torch.device(args.device), offload_type="leaf_level")
        return {}

    @case("unet_reference")
    def _():
        model = UNet2DModel.from_pretrained(pipeline_dir, subfolder="unet", low_cpu_mem_usage=False)
        return {"out": forward(model, unet_inputs, "unet_reference")}

    @case("unet_low_cpu_mem_usage")
    def _():
        model = UNet2DModel.from_pretrained(pipeline_dir, subfolder="unet", low_cpu_mem_usage=True)
        return {"hooks": hooks_of(model), "placement": sorted(set(placement(model).values())),
                "out": forward(model, unet_inputs, "unet_low_cpu_mem_usage")}

    for label, device_map in (("auto", "auto"), ("cpu_string", "cpu"), ("dict", {"": "cpu"}),
                              ("sequential", "sequential"), ("balanced_low_0", "balanced_low_0"),
                              *([("device", args.device)] if args.device != "cpu" else [])):
        @case(f"unet_device_map_{label}")
        def _(device_map=device_map, label=label):
            model = UNet2DModel.from_pretrained(pipeline_dir, subfolder="unet", device_map=device_map)
            return {"hf_device_map": str(getattr(model, "hf_device_map", None)), "hooks": hooks_of(model),
                    "placement": sorted(set(placement(model).values())),
                    "out": forward(model, unet_inputs, f"unet_{label}")}

    @case("cond_reference")
    def _():
        model = UNet2DConditionModel.from_pretrained(cond_dir, low_cpu_mem_usage=False)
        return {"out": forward(model, cond_inputs, "cond_reference")}

    def mapped(model, offload, key):
        return {"hf_device_map": {k: str(v) for k, v in model.hf_device_map.items()}, "hooks": hooks_of(model),
                "placement": placement(model), "offload_files": files_in(offload),
                "out": forward(model, cond_inputs, key)}

    # "auto" under a memory budget: a third of the model's size fits nothing (all to disk); 3/4 splits it.
    budgets = {"third": {"cpu": cond_size // 3}, "three_quarters": {"cpu": cond_size * 3 // 4}}
    if args.device != "cpu":
        budgets["gpu_split"] = {0: cond_size // 2, "cpu": cond_size // 3}
    # Without an accelerator "sequential" and "balanced_low_0" budget as "auto" does: run them on one only.
    strategies = ("auto",) if args.device == "cpu" else ("auto", "sequential", "balanced_low_0")
    for label, max_memory in budgets.items():
        for device_map in strategies:
            @case(f"cond_{device_map}_{label}")
            def _(max_memory=max_memory, device_map=device_map, label=label):
                offload = os.path.join(work, f"offload-{device_map}-{label}")
                model = UNet2DConditionModel.from_pretrained(cond_dir, device_map=device_map, offload_folder=offload,
                                                             max_memory=max_memory)
                return mapped(model, offload, f"cond_{device_map}_{label}")

    @case("cond_auto_unbounded")
    def _():
        model = UNet2DConditionModel.from_pretrained(cond_dir, device_map="auto")
        return mapped(model, "", "cond_auto_unbounded")

    @case("cond_dict_disk_offload")
    def _():
        offload = os.path.join(work, "offload-dict")
        device_map = {"conv_in": "cpu", "time_proj": "cpu", "time_embedding": "cpu", "down_blocks.0": "disk",
                      "down_blocks.1": "cpu", "mid_block": "disk", "up_blocks": "cpu", "conv_norm_out": "disk",
                      "conv_act": "cpu", "conv_out": "cpu"}
        model = UNet2DConditionModel.from_pretrained(cond_dir, device_map=device_map, offload_folder=offload,
                                                     offload_state_dict=True)
        return mapped(model, offload, "cond_dict_disk_offload")

    @case("cond_disk_without_folder")
    def _():
        UNet2DConditionModel.from_pretrained(cond_dir, device_map={"": "disk"})
        return {}

    np.savez(os.path.join(args.out, "arrays.npz"), **arrays)
    with open(os.path.join(args.out, "result.json"), "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    print(json.dumps({k: v.get("ok") for k, v in result["cases"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
