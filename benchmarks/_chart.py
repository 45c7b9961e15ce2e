"""results.png: the chart of benchmarks/run_all.py's ratios (hasten and the peers against raw PyTorch).

Example:
    >>> callable(chart)
    True
"""

from __future__ import annotations

from pathlib import Path

from _render import FRAMEWORKS, TARGETS, _measure, _measure_key, by, lookup, names

# ---------------------------------------------------------------------------- results.png
def chart(records: list[dict], path: Path, quick: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"hasten": "#1f77b4", "accelerate": "#ff7f0e", "fabric": "#9467bd"}
    labels = {"hasten": "hasten", "accelerate": "Accelerate", "fabric": "Lightning Fabric"}
    steps = by(records, "steps")
    groups = [n for n in names(steps) if lookup(records, "steps", n, "hasten")]
    fixed = []  # (label, {framework: speed ratio}, target as a speed ratio)
    for fw, name in (("hasten", "from hasten import Accelerator"), ("accelerate", "from accelerate import Accelerator"),
                     ("fabric", "from lightning.fabric import Fabric")):
        r = lookup(records, "import", name, fw)
        if r:
            if not fixed or fixed[-1][0] != "import\n(vs import torch)":
                fixed.append(("import\n(vs import torch)", {}, 1 / TARGETS["import"]))
            fixed[-1][1][fw] = 1 / r["ratio"]
    r = lookup(records, "launch", "hasten launch", "hasten")
    if r:
        fixed.append(("launch, raw script\n(vs torchrun)", {"hasten": 1 / r["ratio"]}, 1 / TARGETS["launch"]))
    launch = {fw: lookup(records, "launch", name, fw) for fw, name in
              (("hasten", "hasten launch + hasten.Accelerator"), ("accelerate", "accelerate launch + accelerate.Accelerator"))}
    if launch["hasten"]:
        fixed.append(("launch + Accelerator\n(vs torchrun, raw)", {fw: 1 / r["ratio"] for fw, r in launch.items() if r},
                      1 / TARGETS["launch"]))
    gathers = {fw: lookup(records, "gather", "all-gather of 1M floats", fw) for fw in FRAMEWORKS}
    if gathers["hasten"]:
        fixed.append(("gather 1M floats\n(vs all-gather)", {fw: 1 / r["ratio"] for fw, r in gathers.items() if r},
                      1 / TARGETS["gather"]))

    fig, axes = plt.subplots(2, 1, figsize=(13, 10), gridspec_kw={"height_ratios": [1.25, 1]})
    title = "hasten and peers relative to raw PyTorch, 2 processes (higher is better; 1.0 = raw)"
    fig.suptitle(title + ("  [--quick: noisy]" if quick else ""), fontsize=13)

    def bars(ax, group_labels, values, targets, target_label):
        """One group per label, its bars (the frameworks measured there) centred on it; a target segment each."""
        width = 0.8 / max(1, max(len(entry) for entry in values))
        top, labelled = 1.0, set()
        for g, entry in enumerate(values):
            present = [fw for fw in FRAMEWORKS if fw in entry]
            for i, fw in enumerate(present):
                x, y = g + (i - (len(present) - 1) / 2) * width, entry[fw]
                ax.bar(x, y, width * 0.92, color=colors[fw], label=None if fw in labelled else labels[fw])
                labelled.add(fw)
                inside = y > 0.2
                ax.text(x, y - 0.02 if inside else y + 0.02, f"{y:.2f}", ha="center", va="top" if inside else "bottom",
                        fontsize=8, color="white" if inside else "black", fontweight="bold")
                top = max(top, y)
        ax.axhline(1.0, color="black", linewidth=1, label="raw PyTorch = 1.0")
        for g, target in enumerate(targets):
            ax.hlines(target, g - 0.45, g + 0.45, colors="red", linestyles="dashed", linewidth=1.5,
                      label=target_label if g == 0 else None)
        ax.set_xticks(range(len(group_labels)))
        ax.set_xticklabels(group_labels, fontsize=8)
        ax.set_ylim(0, top + 0.3)
        ax.set_xlim(-0.6, len(group_labels) - 0.4)
        ax.legend(fontsize=8, loc="upper center", ncol=5, framealpha=0.95)
        ax.grid(axis="y", alpha=0.3)

    if groups:
        values = []
        for name in groups:
            entry = {}
            for fw in FRAMEWORKS:
                r = lookup(records, "steps", name, fw)
                if r:
                    h = lookup(records, "steps", name, "hasten")
                    # the hasten record says which measure its verdict uses; the peers are shown by the same one
                    value = r.get(_measure_key(h)) if h.get("verdict_on") != "max(wall_ratio, cpu_ratio)" else _measure(r)
                    if value is not None:
                        entry[fw] = value
            values.append(entry)
        bars(axes[0], [n.replace(" acc=", "\nacc=") for n in groups], values, [TARGETS["steps"]] * len(groups),
             "target (hasten ≥ 0.99)")
        axes[0].set_ylabel("steps/s ratio to raw")
        axes[0].set_title("Training steps/s (DDP: main-thread CPU time; FSDP2: wall clock; ZeRO: better of both)",
                          fontsize=10)
    else:
        axes[0].set_axis_off()
    if fixed:
        bars(axes[1], [g[0] for g in fixed], [g[1] for g in fixed], [g[2] for g in fixed],
             "target for hasten (1/1.05; gather 1/1.10)")
        axes[1].set_ylabel("speed ratio (baseline time / time)")
        axes[1].set_title("Fixed costs as speed (baseline time / time): import vs `import torch`, launch to exit vs "
                          "torchrun of the raw script, gather vs raw all_gather_into_tensor", fontsize=10)
    else:
        axes[1].set_axis_off()
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
