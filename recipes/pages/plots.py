"""The plots written next to their results JSON (results/NAME.png), one function per results file."""

from __future__ import annotations

from pathlib import Path

from .runs import lr_note, sweep_label, sweeps

RATIO_AXIS = "communication ratio r (bytes vs dense within-layer parallelism)"


def pyplot():  # noqa: ANN201
    """matplotlib's pyplot on the Agg backend (no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> None:  # noqa: ANN001
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)


def _main_epochs(entries: list[dict]) -> int:
    """The fine-tuning length of the main sweep (longer runs are shown as extra points)."""
    return min(e["epochs"] for e in entries if e["nodes"] > 1)


def plot_cifar10(entries: list[dict], path: Path, title: str = "CIFAR ResNet-20") -> None:
    """Top-1 against communication ratio: the main sweep per N, other runs as marked points."""
    plt = pyplot()
    dense = next(e for e in entries if e["name"] == "dense")
    epochs = _main_epochs(entries)
    fig, ax = plt.subplots(figsize=(6, 4))
    for n, marker in ((2, "o"), (4, "s")):
        pts = sorted((e["ratio"], e["top1"]) for e in entries
                     if e["nodes"] == n and e["budget"] == "global" and e["selection"] in ("magnitude", "separated")
                     and e["epochs"] == epochs)
        if pts:
            ax.plot(*zip(*pts, strict=True), marker=marker, label=f"DISCO N={n} (global budget, magnitude)")
    for e in entries:
        variant = e["name"].endswith(("_layer", "_random", "_taylor"))
        if variant or (e["nodes"] > 1 and e["epochs"] != epochs):
            what = e["name"].split("_")[-1] if variant else f"{e['epochs']} epochs"
            ax.scatter([e["ratio"]], [e["top1"]], marker={"random": "x", "layer": "^", "taylor": "D"}.get(what, "*"),
                       s=60, label=f"N={e['nodes']} {what}", zorder=3)
    ax.axhline(dense["top1"], color="k", ls="--", lw=1, label="dense, one device")
    ax.set_xlabel(RATIO_AXIS)
    ax.set_ylabel("CIFAR-10 top-1 (%)")
    ax.set_title(f"{title}: accuracy vs communication")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    save(fig, path)


def plot_cifar10_vit(entries: list[dict], path: Path) -> None:
    plot_cifar10(entries, path, title="CIFAR ViT (patch 4)")


def _plot_sweeps(ax, entries: list[dict], metric: str) -> None:  # noqa: ANN001
    """One line per sweep and N, then every other DISCO run as an extra point."""
    swept = sweeps(entries)
    for i, (key, pts) in enumerate(swept.items()):
        for n, marker in ((2, "o"), (4, "s")):
            xy = sorted((e["ratio"], e[metric]) for e in pts if e["nodes"] == n)
            if xy:
                ax.plot(*zip(*xy, strict=True), marker=marker, ls="-" if i == 0 else "--",
                        label=f"DISCO N={n} ({sweep_label(key)})")
    on_line = {id(e) for pts in swept.values() for e in pts}
    for e in entries:
        if e["nodes"] > 1 and id(e) not in on_line:  # one run outside the sweeps: a diamond for Taylor, else a star
            ax.scatter([e["ratio"]], [e[metric]], marker="D" if e["selection"] == "taylor" else "*", s=60, zorder=3,
                       label=f"N={e['nodes']}, {e['selection']}, {e['epochs']} fine-tuning epochs{lr_note(e)}")


def plot_sr(entries: list[dict], path: Path) -> None:
    """PSNR against communication ratio, Set5 and Set14, with dense and bicubic as lines."""
    plt = pyplot()
    dense = next(e for e in entries if e["name"] == "dense")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, s in zip(axes, ("set5", "set14"), strict=True):
        _plot_sweeps(ax, entries, f"psnr_{s}")
        ax.axhline(dense[f"psnr_{s}"], color="k", ls="--", lw=1, label="dense, one device")
        ax.axhline(dense[f"bicubic_psnr_{s}"], color="gray", ls=":", lw=1, label="bicubic")
        ax.set_xlabel(RATIO_AXIS)
        ax.set_ylabel(f"{s.capitalize()} x4 PSNR on Y (dB)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{dense['model']}, x4 super-resolution: PSNR vs communication")
    save(fig, path)


def _plot_vs_ratio(entries: list[dict], metric: str, ylabel: str, path: Path) -> None:
    """``metric`` against communication ratio: one line per sweep and N, the dense model as a dashed line."""
    plt = pyplot()
    dense = next(e for e in entries if e["nodes"] == 1)
    fig, ax = plt.subplots(figsize=(6, 4))
    _plot_sweeps(ax, entries, metric)
    ax.axhline(dense[metric], color="k", ls="--", lw=1, label="dense, one device")
    ax.set_xlabel(RATIO_AXIS)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{dense['model']}: {metric} vs communication")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    save(fig, path)


def plot_seg(entries: list[dict], path: Path) -> None:
    _plot_vs_ratio(entries, "miou", "CamVid test mIoU (%)", path)


def plot_det(entries: list[dict], path: Path) -> None:
    """mAP against communication ratio on the generated set."""
    _plot_vs_ratio([e for e in entries if e["dataset"] == "generated"], "map",
                   "COCO mAP@[.5:.95] (generated test split)", path)
