"""Regenerate the plots and the tables of README.md, docs/*.md and bench/README.md from results/*.json (no number is
typed by hand).

    python recipes/tables.py            # rewrite every table and plot
    python recipes/tables.py --check    # exit 1 if a page is not what the JSON gives (no file written)

Each table sits in a page between ``<!-- table:NAME -->`` and ``<!-- /table:NAME -->``; NAME is a key of
:data:`TABLES`.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cifar10_resnet(entries: list[dict]) -> str:
    dense = next(e for e in entries if e["name"] == "dense")
    rows = ["| run | N | budget | selection | epochs | r (achieved) | top-1 % | vs dense | KB moved / image | "
            "FLOPs vs dense | weights / node vs whole |", "|" + "---|" * 11]
    for e in sorted(entries, key=lambda e: (e["nodes"], -e["ratio"], e["name"])):
        if e["name"] == "dense":
            rows.append(f"| dense (one device) | 1 | - | - | {e['epochs']} | 1 | {e['top1']:.2f} | - | - "
                        "| 1.00 | 1.00 |")
            continue
        w = max(e["params_per_node"]) / e["params_dense"]
        rows.append(
            f"| {e['name']} | {e['nodes']} | {e['budget']} | {e['selection']} | {e['epochs']} | {e['ratio']:.3f} | "
            f"{e['top1']:.2f} | {e['top1'] - dense['top1']:+.2f} | {e['bytes'] / 1e3:.1f} (dense "
            f"{e['dense_bytes'] / 1e3:.1f}) | {e['flops_total'] / e['flops_dense']:.2f} | {w:.2f} |")
    return "\n".join(rows)


def cifar10_summary(entries: list[dict]) -> str:
    """The issue's success checks, computed from the JSON."""
    by = {e["name"]: e for e in entries}
    d = by["dense"]["top1"]
    lines = []
    if {"n2_r0", "n2_r0.05"} <= by.keys():
        sep, r05 = by["n2_r0"]["top1"], by["n2_r0.05"]["top1"]
        lines.append(f"- N=2, r=0.05 recovers {(r05 - sep) / (d - sep):.0%} of the accuracy gap between separated "
                     f"branches ({sep:.2f}) and dense ({d:.2f}).")
    for name in ("n2_r0.2", "n2_r0.2_ft6"):
        if name in by:
            e = by[name]
            lines.append(f"- N=2, r=0.2 with {e['epochs']} fine-tuning epochs: {e['top1'] - d:+.2f} points vs dense; "
                         f"FLOPs {e['flops_total'] / e['flops_dense']:.2f}x, weights per node "
                         f"{max(e['params_per_node']) / e['params_dense']:.2f}x of the whole model.")
    if "n2_r0.1_random" in by:
        rnd = by["n2_r0.1_random"]["top1"]
        for name in ("n2_r0.1", "n2_r0.1_taylor", "n2_r0.1_layer"):
            if name in by:
                e = by[name]
                lines.append(f"- N=2, r=0.1, {e['budget']} budget, {e['selection']} scores: {e['top1']:.2f} "
                             f"({e['top1'] - rnd:+.2f} vs random links at the same r).")
    return "\n".join(lines)


def pts_epochs(entries: list[dict]) -> int:
    """The fine-tuning length of the main sweep (longer runs are shown as extra points)."""
    return min(e["epochs"] for e in entries if e["nodes"] > 1)


def plot_cifar10(entries: list[dict], path: Path, title: str = "CIFAR ResNet-20") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dense = next(e for e in entries if e["name"] == "dense")
    fig, ax = plt.subplots(figsize=(6, 4))
    for n, marker in ((2, "o"), (4, "s")):
        pts = sorted((e["ratio"], e["top1"]) for e in entries
                     if e["nodes"] == n and e["budget"] == "global" and e["selection"] in ("magnitude", "separated")
                     and e["epochs"] == pts_epochs(entries))
        if pts:
            ax.plot(*zip(*pts, strict=True), marker=marker, label=f"DISCO N={n} (global budget, magnitude)")
    for e in entries:
        variant = e["name"].endswith(("_layer", "_random", "_taylor"))
        if variant or (e["nodes"] > 1 and e["epochs"] != pts_epochs(entries)):
            what = e["name"].split("_")[-1] if variant else f"{e['epochs']} epochs"
            ax.scatter([e["ratio"]], [e["top1"]], marker={"random": "x", "layer": "^", "taylor": "D"}.get(what, "*"),
                       s=60,
                       label=f"N={e['nodes']} {what}", zorder=3)
    ax.axhline(dense["top1"], color="k", ls="--", lw=1, label="dense, one device")
    ax.set_xlabel("communication ratio r (bytes vs dense within-layer parallelism)")
    ax.set_ylabel("CIFAR-10 top-1 (%)")
    ax.set_title(f"{title}: accuracy vs communication")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_cifar10_vit(entries: list[dict], path: Path) -> None:
    plot_cifar10(entries, path, title="CIFAR ViT (patch 4)")


def cifar10_vit_summary(entries: list[dict]) -> str:
    """The transformer issue's success checks, computed from the JSON."""
    by = {e["name"]: e for e in entries}
    d = by["dense"]["top1"]
    lines = []
    for name in ("n2_r0.2", "n4_r0.2"):
        if name in by:
            e = by[name]
            sep = by.get(f"n{e['nodes']}_r0")
            vs_sep = f", separated branches {sep['top1']:.2f} ({e['top1'] - sep['top1']:+.2f})" if sep else ""
            lines.append(f"- N={e['nodes']}, r=0.2 ({e['epochs']} fine-tuning epochs): top-1 {e['top1']:.2f}, "
                         f"{e['top1'] - d:+.2f} points vs dense ({d:.2f}){vs_sep}.")
            if e.get("stats_bytes") is not None and e["bytes"]:
                lines.append(f"  LayerNorm statistics: {e['stats_bytes'] / 1e3:.1f} KB per image, "
                             f"{e['stats_bytes'] / e['bytes']:.1%} of the {e['bytes'] / 1e3:.1f} KB of feature links.")
    return "\n".join(lines)


def sr_rrdbnet(entries: list[dict]) -> str:
    """Super-resolution x4: PSNR/SSIM (Y, shaved) per set, bicubic and dense first."""
    dense = next(e for e in entries if e["name"] == "dense")
    rows = ["| run | N | scores | epochs | r (achieved) | Set5 PSNR (dB) | vs dense | Set5 SSIM | Set14 PSNR | "
            "BSD100 PSNR | KB moved / 24x24 LR input | FLOPs vs dense | weights / node vs whole |", "|" + "---|" * 13]
    b5 = dense["bicubic_psnr_set5"]
    rows.append(f"| bicubic | - | - | - | - | {b5:.2f} | {b5 - dense['psnr_set5']:+.2f} "
                f"| {dense['bicubic_ssim_set5']:.4f} | {dense['bicubic_psnr_set14']:.2f} | "
                f"{dense['bicubic_psnr_bsd100']:.2f} | - | - | - |")
    for e in sorted(entries, key=lambda e: (e["nodes"], -e["ratio"], e["name"])):
        if e["name"] == "dense":
            rows.append(f"| dense (one device) | 1 | - | {e['epochs']} | 1 | {e['psnr_set5']:.2f} | - "
                        f"| {e['ssim_set5']:.4f} | {e['psnr_set14']:.2f} | {e['psnr_bsd100']:.2f} | - | 1.00 | 1.00 |")
            continue
        w = max(e["params_per_node"]) / e["params_dense"]
        rows.append(
            f"| {e['name']} | {e['nodes']} | {e['selection']} | {e['epochs']} | {e['ratio']:.3f} | "
            f"{e['psnr_set5']:.2f} | {e['psnr_set5'] - dense['psnr_set5']:+.2f} | {e['ssim_set5']:.4f} | "
            f"{e['psnr_set14']:.2f} | {e['psnr_bsd100']:.2f} | "
            f"{e['bytes'] / 1e3:.1f} (dense {e['dense_bytes'] / 1e3:.1f}) | "
            f"{e['flops_total'] / e['flops_dense']:.2f} | {w:.2f} |")
    return "\n".join(rows)


def sr_summary(entries: list[dict]) -> str:
    """The super-resolution issue's success checks, computed from the JSON."""
    by = {e["name"]: e for e in entries}
    dense = by["dense"]
    d5, b5 = dense["psnr_set5"], dense["bicubic_psnr_set5"]
    lines = []
    seps = [e for e in entries if e["nodes"] == 2 and e["ratio"] == 0]
    r01 = sorted((e for e in entries if e["name"].startswith("n2_r0.1")), key=lambda e: (e["epochs"], e["name"]))
    for e in r01:
        sep = separated_for(e, seps)
        vs_sep = (f"; separated branches ({sep['epochs']} epochs{_lr(sep)}) {sep['psnr_set5']:.2f} dB "
                  f"({e['psnr_set5'] - sep['psnr_set5']:+.2f})") if sep else ""
        lines.append(f"- N=2, r=0.1, {e['selection']} scores, {e['epochs']} fine-tuning epochs{_lr(e)}: Set5 "
                     f"{e['psnr_set5']:.2f} dB, {e['psnr_set5'] - d5:+.2f} dB vs dense ({d5:.2f}){vs_sep}.")
    if r01:
        best = max(r01, key=lambda e: e["psnr_set5"])
        gap = best["psnr_set5"] - d5
        lines.append(f"- Target, N=2 r=0.1 at most 0.15 dB below dense on Set5: the best run, {best['name']}, is "
                     f"{gap:+.3f} dB: {'met' if gap >= -0.15 else 'missed'}.")
    for key, pts in sweeps(entries).items():
        disco = [e for e in pts if e["ratio"] > 0]
        worst = min(disco, key=lambda e: e["psnr_set5"])
        above = sum(e["psnr_set5"] > b5 for e in disco)
        seps_below = [e["name"] for e in pts if e["ratio"] == 0 and e["psnr_set5"] <= b5]
        lines.append(f"- Sweep {_sweep_label(key)}: DISCO models above bicubic on Set5 ({b5:.2f} dB): {above} of "
                     f"{len(disco)}; the lowest, {worst['name']}, is {worst['psnr_set5'] - b5:+.2f} dB vs bicubic "
                     f"(dense {d5 - b5:+.2f} dB)" + (f"; separated branches below bicubic: {', '.join(seps_below)}"
                                                     if seps_below else "") + ".")
    n4 = [e for e in entries if e["nodes"] == 4 and e["ratio"] > 0]
    if n4:
        best4 = max(n4, key=lambda e: e["psnr_set5"])
        lines.append(f"- Best N=4 model: {best4['name']}, {best4['psnr_set5'] - b5:+.2f} dB vs bicubic.")
    return "\n".join(lines)


def _lr(e: dict) -> str:
    """``", lr 0.001"`` for a run that records its fine-tuning rate, else ``""`` (the recipe's default)."""
    return f", lr {e['lr']:g}" if e.get("lr") else ""


def separated_for(e: dict, seps: list[dict]) -> dict | None:
    """The separated-branches run to compare ``e`` with: fine-tuned as long at the same rate, else as long,
    else the longest-tuned shorter one, else the shortest-tuned one."""
    same = [x for x in seps if x["epochs"] == e["epochs"]]
    if same:
        return next((x for x in same if x.get("lr") == e.get("lr")), same[0])
    shorter = [x for x in seps if x["epochs"] < e["epochs"]]
    return max(shorter, key=lambda x: x["epochs"]) if shorter else min(seps, key=lambda x: x["epochs"], default=None)


def sweeps(entries: list[dict]) -> dict[tuple, list[dict]]:
    """The ratio sweeps among the DISCO runs: (scores, epochs, lr) -> its runs at every N, separated branches
    with the same fine-tuning included. A setting run at three or more ratios at N=2 is a sweep (a line in the
    plots); any other run is an extra point."""
    disco = [e for e in entries if e["nodes"] > 1]
    out = {}
    for key in sorted({(e["selection"], e["epochs"], e.get("lr")) for e in disco if e["selection"] != "separated"},
                      key=lambda k: (k[1], k[2] or 0, k[0])):
        sel, ep, lr = key
        pts = [e for e in disco if (e["epochs"], e.get("lr")) == (ep, lr) and e["selection"] in (sel, "separated")]
        if len({e["ratio"] for e in pts if e["nodes"] == 2 and e["selection"] == sel}) >= 3:
            out[key] = pts
    return out


def _sweep_label(key: tuple) -> str:
    sel, ep, lr = key
    return f"{sel}, {ep} epochs" + _lr({"lr": lr})


def _plot_sweeps(ax, entries: list[dict], metric: str) -> None:  # noqa: ANN001
    """One line per sweep and N, then every other DISCO run as an extra point."""
    swept = sweeps(entries)
    for i, (key, pts) in enumerate(swept.items()):
        for n, marker in ((2, "o"), (4, "s")):
            xy = sorted((e["ratio"], e[metric]) for e in pts if e["nodes"] == n)
            if xy:
                ax.plot(*zip(*xy, strict=True), marker=marker, ls="-" if i == 0 else "--",
                        label=f"DISCO N={n} ({_sweep_label(key)})")
    on_line = {id(e) for pts in swept.values() for e in pts}
    for e in entries:
        if e["nodes"] > 1 and id(e) not in on_line:
            _extra_point(ax, e, e[metric])


def _extra_point(ax, e: dict, y: float) -> None:  # noqa: ANN001
    """One run outside the main sweep: a diamond for Taylor scores, else a star, labelled with what differs."""
    ax.scatter([e["ratio"]], [y], marker="D" if e["selection"] == "taylor" else "*", s=60, zorder=3,
               label=f"N={e['nodes']}, {e['selection']}, {e['epochs']} fine-tuning epochs{_lr(e)}")


def plot_sr(entries: list[dict], path: Path) -> None:
    """PSNR against communication ratio, Set5 and Set14, with dense and bicubic as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dense = next(e for e in entries if e["name"] == "dense")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, s in zip(axes, ("set5", "set14"), strict=True):
        _plot_sweeps(ax, entries, f"psnr_{s}")
        ax.axhline(dense[f"psnr_{s}"], color="k", ls="--", lw=1, label="dense, one device")
        ax.axhline(dense[f"bicubic_psnr_{s}"], color="gray", ls=":", lw=1, label="bicubic")
        ax.set_xlabel("communication ratio r (bytes vs dense within-layer parallelism)")
        ax.set_ylabel(f"{s.capitalize()} x4 PSNR on Y (dB)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{dense['model']}, x4 super-resolution: PSNR vs communication")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def seg_deeplabv3plus(entries: list[dict]) -> str:
    """Segmentation: mIoU and pixel accuracy, then IoU per class (where communication matters)."""
    dense = next(e for e in entries if e["name"] == "dense")
    classes = list(dense["per_class_iou"])
    rows = ["| run | N | epochs | r (achieved) | mIoU % | vs dense | pixel acc. % | KB moved / image | "
            "FLOPs vs dense | weights / node vs whole |", "|" + "---|" * 10]
    order = sorted(entries, key=lambda e: (e["nodes"], -e["ratio"], e["name"]))
    for e in order:
        if e["name"] == "dense":
            rows.append(f"| dense (one device) | 1 | {e['epochs']} | 1 | {e['miou']:.2f} | - | {e['pixel_acc']:.2f} "
                        "| - | 1.00 | 1.00 |")
            continue
        w = max(e["params_per_node"]) / e["params_dense"]
        rows.append(f"| {e['name']} | {e['nodes']} | {e['epochs']} | {e['ratio']:.3f} | {e['miou']:.2f} | "
                    f"{e['miou'] - dense['miou']:+.2f} | {e['pixel_acc']:.2f} | {e['bytes'] / 1e3:.1f} (dense "
                    f"{e['dense_bytes'] / 1e3:.1f}) | {e['flops_total'] / e['flops_dense']:.2f} | {w:.2f} |")
    rows += ["", "IoU per class (%):", "", "| run | " + " | ".join(classes) + " |", "|" + "---|" * (len(classes) + 1)]
    for e in order:
        iou = e["per_class_iou"]
        rows.append(f"| {e['name']} | " + " | ".join("-" if iou.get(c) is None else f"{iou[c]:.1f}" for c in classes)
                    + " |")
    return "\n".join(rows)


def control_lines(entries: list[dict], dense: dict, metric: str, label: str) -> list[str]:
    """The every-link-kept control runs (r = 1, N > 1): what the fine-tuning alone changes."""
    return [f"- Control, every link kept ({c['name']}, {c['epochs']} fine-tuning epochs): {label} {c[metric]:.2f}, "
            f"{c[metric] - dense[metric]:+.2f} vs dense: what the fine-tuning alone changes."
            for c in entries if c["nodes"] > 1 and c["ratio"] >= 1 and c.get("dataset") == dense.get("dataset")]


def seg_summary(entries: list[dict]) -> str:
    """The segmentation issue's success checks and where communication matters, from the JSON."""
    d = next(e for e in entries if e["name"] == "dense")

    def separated(e: dict) -> dict | None:  # N=2 separated branches with the same fine-tuning length
        return next((x for x in entries if x["nodes"] == 2 and x["ratio"] == 0 and x["epochs"] == e["epochs"]), None)

    lines, pairs = [], []
    for e in sorted((e for e in entries if e["name"].startswith("n2_r0.1")), key=lambda e: e["epochs"]):
        s = separated(e)
        vs_sep = (f"; separated branches with the same fine-tuning {s['miou']:.2f} ({e['miou'] - s['miou']:+.2f})"
                  if s else "")
        lines.append(f"- N=2, r=0.1, {e['epochs']} fine-tuning epochs: mIoU {e['miou']:.2f}, "
                     f"{e['miou'] - d['miou']:+.2f} points vs dense ({d['miou']:.2f}){vs_sep}.")
        if s:
            pairs.append((e, s))
    lines += control_lines(entries, d, "miou", "mIoU")
    if pairs:
        e, s = pairs[-1]  # the longest fine-tuning
        gap = {c: (e["per_class_iou"][c] or 0) - (s["per_class_iou"][c] or 0) for c in d["per_class_iou"]
               if d["per_class_iou"][c] is not None}
        top = sorted(gap, key=gap.get, reverse=True)
        lines.append(f"- Where communication matters (IoU of {e['name']} minus {s['name']}): "
                     + ", ".join(f"{c} {gap[c]:+.1f}" for c in top[:4]) + "; least: "
                     + ", ".join(f"{c} {gap[c]:+.1f}" for c in top[-3:]) + ".")
    return "\n".join(lines)


def _plot_vs_ratio(entries: list[dict], metric: str, ylabel: str, path: Path) -> None:
    """``metric`` against communication ratio: one line per N, the dense model as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dense = next(e for e in entries if e["nodes"] == 1)
    fig, ax = plt.subplots(figsize=(6, 4))
    _plot_sweeps(ax, entries, metric)
    ax.axhline(dense[metric], color="k", ls="--", lw=1, label="dense, one device")
    ax.set_xlabel("communication ratio r (bytes vs dense within-layer parallelism)")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{dense['model']}: {metric} vs communication")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_seg(entries: list[dict], path: Path) -> None:
    _plot_vs_ratio(entries, "miou", "CamVid test mIoU (%)", path)


def det_ssd(entries: list[dict]) -> str:
    """Detection: COCO mAP@[.5:.95] and mAP@.5 per run, the generated set first, then coco128."""
    rows = ["| data | run | N | scores | epochs | r (achieved) | mAP | mAP@.5 | vs dense (mAP) | "
            "leader post-processing ms | KB moved / image | FLOPs vs dense |", "|" + "---|" * 12]
    for ds in ("generated", "coco128"):
        sel = [e for e in entries if e["dataset"] == ds]
        dense = next((e for e in sel if e["nodes"] == 1), None)
        for e in sorted(sel, key=lambda e: (e["nodes"], -e["ratio"], e["name"])):
            note = " (evaluated on its training images)" if e.get("eval_on_train") else ""
            vs = "-" if dense is None or e is dense else f"{e['map'] - dense['map']:+.2f}"
            moved = "-" if e["nodes"] == 1 else f"{e['bytes'] / 1e3:.1f} (dense {e['dense_bytes'] / 1e3:.1f})"
            fl = "1.00" if e["nodes"] == 1 else f"{e['flops_total'] / e['flops_dense']:.2f}"
            post = "-" if e.get("post_ms") is None else f"{e['post_ms']:.1f}"
            sel_ = "-" if e["nodes"] == 1 else e["selection"]
            rows.append(f"| {ds}{note} | {e['name']} | {e['nodes']} | {sel_} | {e.get('epochs') or '-'} | "
                        f"{e['ratio']:.3f} | {e['map']:.2f} | {e['map50']:.2f} | {vs} | {post} | {moved} | {fl} |")
    return "\n".join(rows)


def det_summary(entries: list[dict]) -> str:
    """The detection issue's success checks from the JSON (generated set), and the leader's post-processing share."""
    d = next((e for e in entries if e["dataset"] == "generated" and e["nodes"] == 1), None)
    seps = [e for e in entries if e["dataset"] == "generated" and e["nodes"] == 2 and e["ratio"] == 0]
    lines, checks = [], []
    for e in sorted((e for e in entries if d and e["dataset"] == "generated" and e["name"].startswith("n2_r0.1")),
                    key=lambda e: (e["epochs"], e["name"])):
        sep = separated_for(e, seps)
        vs_sep = (f"; separated branches ({sep['epochs']} fine-tuning epochs{_lr(sep)}) {sep['map']:.2f} "
                  f"({e['map'] - sep['map']:+.2f})") if sep else ""
        lines.append(f"- generated set, N=2, r=0.1, {e['selection']} scores, {e['epochs']} fine-tuning epochs{_lr(e)}: "
                     f"mAP {e['map']:.2f}, "
                     f"{e['map'] - d['map']:+.2f} points vs dense ({d['map']:.2f}){vs_sep}.")
        checks.append((e["map"] - d["map"], sep is not None and e["map"] > sep["map"], e["name"]))
    if checks:
        gap, above, name = max(checks)
        lines.append(f"- Target, N=2 r=0.1 at most 1.5 mAP below dense and above separated branches: the best run, "
                     f"{name}, is {gap:+.2f} ({'above' if above else 'not above'} separated): "
                     f"{'met' if gap >= -1.5 and above else 'missed'}.")
    if d:
        lines += control_lines(entries, d, "map", "mAP")
    shares = [(x["post_ms"], x["model_ms"]) for x in entries if x.get("post_ms") and x.get("model_ms")]
    if shares:
        pct = [100 * p / (p + m) for p, m in shares]
        lines.append(f"- leader's post-processing (decoding + NMS) against the split model's forward, both one "
                     f"process: {min(pct):.1f}-{max(pct):.1f}% of the time per image over {len(pct)} runs "
                     "(SSD300 over a 100 Mbit/s link: the post-processing lines of bench/README.md).")
    return "\n".join(lines)


def det_lr(entries: list[dict]) -> str:
    """The detection fine-tuning rate sweep (recipes/det/lr_sweep.py): N=2, r = 1 and r = 0.1."""
    dense = next(e for e in entries if e["nodes"] == 1)
    rows = [f"| r | scores | lr | distillation | epochs | mAP | vs dense ({dense['map']:.2f}) | mAP@.5 |",
            "|" + "---|" * 8]
    for e in entries:
        if e["nodes"] > 1:
            r = "1 (every link kept)" if e["ratio"] >= 1 else f"{e['ratio']:.3f}"
            rows.append(f"| {r} | {e['selection']} | {e['lr']:g} | {e['distill']:g} | {e['epochs']} | {e['map']:.2f} | "
                        f"{e['map'] - dense['map']:+.2f} | {e['map50']:.2f} |")
    return "\n".join(rows)


def plot_det(entries: list[dict], path: Path) -> None:
    """mAP against communication ratio on the generated set."""
    _plot_vs_ratio([e for e in entries if e["dataset"] == "generated"], "map",
                   "COCO mAP@[.5:.95] (generated test split)", path)


def latency_headline(data: dict | list) -> str:
    """ResNet-50 and the CIFAR model at N=2 and N=4: latency per link, measured beside predicted."""
    entries = data["entries"] if isinstance(data, dict) else data
    rows = ["| model | N | link | mode | codec | r | measured ms | predicted ms | vs dense | weights / node (MB) |",
            "|" + "---|" * 10]
    keyf = lambda e: (e["model"], e["nodes"], e.get("shaping") or "", -(e.get("bandwidth_mbit") or 1e9),  # noqa: E731
                      {"single": 0, "dense": 1, "disco": 2, "separated": 3}.get(e["mode"], 4), -(e["ratio"] or 0),
                      e.get("codec") or "")
    measured = [e for e in entries if e.get("latency_ms_median") is not None]
    for e in sorted(measured, key=keyf):
        dense = next((d for d in measured if d["mode"] == "dense" and d["model"] == e["model"]
                      and d["nodes"] == e["nodes"] and d.get("bandwidth_mbit") == e.get("bandwidth_mbit")
                      and d.get("shaping") == e.get("shaping") and d.get("codec") == "fp32"), None)
        link = "-" if e["mode"] == "single" else (
            f"{e['bandwidth_mbit']:g} Mbit/s {e['shaping']}" if e.get("bandwidth_mbit") else "loopback")
        speed = "-"
        if dense and e["mode"] != "single":
            speed = f"{dense['latency_ms_median'] / e['latency_ms_median']:.2f}x"
        pred = f"{e['predicted_ms']:.1f}" if e.get("predicted_ms") is not None else "-"
        w = max(e.get("weight_bytes_per_node") or [0]) / 1e6
        ratio = "-" if e.get("ratio") is None else f"{e['ratio']:.2f}"
        rows.append(f"| {e['model']} | {e['nodes']} | {link} | {e['mode']} | {e.get('codec') or '-'} | {ratio} | "
                    f"{e['latency_ms_median']:.1f} | {pred} | {speed} | {w:.2f} |")
    return "\n".join(rows)


def model_size(entries: list[dict]) -> str:
    """The size of a results file's dense model(s): parameters and FLOPs at the partition's input shape."""
    lines = []
    for d in (e for e in entries if e["nodes"] == 1):
        shape = "x".join(str(v) for v in d["input_shape"][1:]) if d.get("input_shape") else None
        at = f" at {shape}" if shape else " per image"
        lines.append(f"- `{d['model']}`: {d['params_per_node'][0] / 1e6:.2f} M parameters, "
                     f"{d['flops_total'] / 1e9:.3f} GFLOPs{at}.")
    return "\n".join(lines)


# the task and metric of each results file in the headline table: (label, metric key, unit, higher is better)
HEADLINE = {
    "cifar10_resnet": ("CIFAR-10 classification", "top1", "top-1 %"),
    "cifar10_vit": ("CIFAR-10 classification", "top1", "top-1 %"),
    "sr_rrdbnet": ("x4 super-resolution", "psnr_set5", "Set5 PSNR dB"),
    "seg_deeplabv3plus": ("CamVid segmentation", "miou", "mIoU %"),
    "det_ssd": ("detection (generated set)", "map", "mAP"),
    "det_ssd_small": ("detection (generated set)", "map", "mAP"),
    "imagenette_resnet": ("Imagenette, 1000 photos (proxy for ImageNet)", "top1", "top-1 %"),
}


def headline(results: dict[str, list[dict]]) -> str:
    """One row per results file: dense, the best N=2 DISCO model at r = 0.1 and separated branches fine-tuned
    the same way, with the bytes each moves."""
    rows = ["| task | model | metric | dense (1 device) | DISCO N=2, r=0.1 (best run) | separated branches, N=2 | "
            "KB moved / input: DISCO (dense split) |", "|" + "---|" * 7]
    for name, (label, metric, unit) in HEADLINE.items():
        entries = [e for e in results.get(name, []) if e.get("dataset", "generated") == "generated"]
        dense = next((e for e in entries if e["nodes"] == 1), None)
        runs = [e for e in entries if e["nodes"] == 2 and e.get("target_ratio", e["ratio"]) == 0.1
                and e["selection"] != "random"]
        if dense is None or not runs:
            continue
        best = max(runs, key=lambda e: e[metric])
        sep = separated_for(best, [e for e in entries if e["nodes"] == 2 and e["ratio"] == 0])
        sep_s = "-" if sep is None else f"{sep[metric]:.2f} ({sep['epochs']} epochs{_lr(sep)})"
        rows.append(f"| {label} | `{dense['model']}` | {unit} | {dense[metric]:.2f} | {best[metric]:.2f} "
                    f"({best['selection']}, {best['epochs']} epochs{_lr(best)}) | {sep_s} | "
                    f"{best['bytes'] / 1e3:.1f} ({best['dense_bytes'] / 1e3:.1f}) |")
    return "\n".join(rows)


def latency_short(data: dict | list) -> str:
    """Per model, N=2 over an emulated 100 Mbit/s link, fp32: dense within-layer parallelism against DISCO."""
    entries = data["entries"] if isinstance(data, dict) else data
    ok = [e for e in entries if e["nodes"] == 2 and e.get("bandwidth_mbit") == 100 and e.get("shaping") == "pacing"
          and e.get("codec") == "fp32" and e.get("latency_ms_median") is not None]
    rows = ["| model | input | dense ms | DISCO r=0.2 ms | DISCO r=0.1 ms | DISCO r=0.05 ms | r=0.1 vs dense |",
            "|" + "---|" * 7]
    for model in sorted({e["model"] for e in ok}):
        dense = next((e for e in ok if e["model"] == model and e["mode"] == "dense"), None)
        if dense is None:
            continue
        at = {round(e["ratio"], 2): e["latency_ms_median"] for e in ok if e["model"] == model and e["mode"] == "disco"}
        cells = " | ".join(f"{at[r]:.0f}" if r in at else "-" for r in (0.2, 0.1, 0.05))
        speed = f"{dense['latency_ms_median'] / at[0.1]:.1f}x" if 0.1 in at else "-"
        shape = "x".join(str(v) for v in dense["input_shape"][1:])
        rows.append(f"| {model} | {shape} | {dense['latency_ms_median']:.0f} | {cells} | {speed} |")
    return "\n".join(rows)

# ---- the latency sweep (bench/latency.py): bench/README.md's report and results/latency.png -------------

LATENCY_RATIOS = [1.0, 0.2, 0.1, 0.05, 0.0]
LATENCY_CODECS = ["fp32", "fp16"]
# the task models of the sweep (bench/latency.py --models ...): their gains over dense are listed one by one
LATENCY_TASK_MODELS = ("deit_small_patch16_224", "rrdbnet", "deeplabv3plus_resnet50", "ssd300_vgg16_split")


def _f(x: object, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def headlines(entries: list[dict], big: str = "resnet50") -> list[str]:
    """The latency sweep's findings, one line each, from the entries."""
    def get(**kw: object) -> dict | None:
        for e in entries:
            if all(e.get(k) == v for k, v in kw.items()) and e.get("latency_ms_median") is not None:
                return e
        return None

    out = []
    for codec in LATENCY_CODECS:
        d = get(model=big, mode="dense", nodes=2, codec=codec, bandwidth_mbit=100, shaping="pacing")
        s = get(model=big, mode="disco", nodes=2, ratio_target=0.2, codec=codec, bandwidth_mbit=100,
                shaping="pacing")
        if d and s:
            out.append(f"- {big}, N=2, 100 Mbit/s, {codec} on the wire: DISCO r=0.2 "
                       f"{s['latency_ms_median']:.0f} ms vs dense {d['latency_ms_median']:.0f} ms: "
                       f"**{d['latency_ms_median'] / s['latency_ms_median']:.2f}x faster** (model predicts "
                       f"{d['predicted_ms'] / s['predicted_ms']:.2f}x)")
    d32 = get(model=big, mode="dense", nodes=2, codec="fp32", bandwidth_mbit=100, shaping="pacing")
    s16 = get(model=big, mode="disco", nodes=2, ratio_target=0.2, codec="fp16", bandwidth_mbit=100,
              shaping="pacing")
    if d32 and s16:
        out.append(f"- {big}, N=2, 100 Mbit/s: DISCO r=0.2 with fp16 on the wire vs dense fp32: "
                   f"**{d32['latency_ms_median'] / s16['latency_ms_median']:.2f}x faster**")
    for n, r in ((2, 0.2), (4, 0.1)):
        e = next((e for e in entries if e["model"] == big and e["nodes"] == n and e.get("ratio_target") == r
                  and e.get("weight_fraction_max") is not None), None)
        if e:
            out.append(f"- {big} weights per node at N={n}, r={r}: at most **{e['weight_fraction_max']:.3f}x** "
                       f"of the whole model ({max(e['weight_bytes_per_node']) / 1e6:.1f} MB of "
                       f"{e['params_dense'] * 4 / 1e6 if e.get('params_dense') else float('nan'):.1f} MB)")
    for model in sorted({e["model"] for e in entries}, key=lambda m: m != big):
        one = get(model=model, mode="single", nodes=1)
        rt = get(model=model, mode="dense", nodes=1)
        if one and rt:
            out.append(f"- {model}, unshaped, N=1: the runtime takes {rt['latency_ms_median']:.2f} ms vs plain "
                       f"PyTorch {one['latency_ms_median']:.2f} ms: "
                       f"**{(rt['latency_ms_median'] / one['latency_ms_median'] - 1) * 100:+.0f}%**")
    gains = []
    for model in LATENCY_TASK_MODELS:
        for n in (2, 4):
            d = get(model=model, mode="dense", nodes=n, codec="fp32", bandwidth_mbit=100, shaping="pacing")
            for r in sorted({e["ratio_target"] for e in entries if e["model"] == model and e["nodes"] == n
                             and e.get("ratio_target") is not None and 0 < e["ratio_target"] < 1}, reverse=True):
                s = get(model=model, mode="disco", nodes=n, ratio_target=r, codec="fp32", bandwidth_mbit=100,
                        shaping="pacing")
                if d and s:
                    gains.append((d["latency_ms_median"] / s["latency_ms_median"], model, n, r, d, s))
    for g, model, n, r, d, s in sorted(gains, key=lambda t: (t[1], t[2], -t[3])):
        out.append(f"- {model}, N={n}, 100 Mbit/s, fp32: DISCO r={r:g} {s['latency_ms_median']:.0f} ms vs dense "
                   f"{d['latency_ms_median']:.0f} ms: **{g:.2f}x faster** (model predicts "
                   f"{d['predicted_ms'] / s['predicted_ms']:.2f}x)")
    by_task = {}
    for g, model, n, r, _, _ in gains:
        if r == 0.1 and n == 2:
            by_task[model] = g
    big_d = get(model=big, mode="dense", nodes=2, codec="fp32", bandwidth_mbit=100, shaping="pacing")
    big_s = get(model=big, mode="disco", nodes=2, ratio_target=0.1, codec="fp32", bandwidth_mbit=100,
                shaping="pacing")
    if big_d and big_s:
        by_task[big] = big_d["latency_ms_median"] / big_s["latency_ms_median"]
    if len(by_task) > 1:
        best = max(by_task, key=by_task.get)
        listing = ", ".join(f"{m} {g:.2f}x" for m, g in sorted(by_task.items(), key=lambda t: -t[1]))
        out.append(f"- largest gain over dense at N=2, r=0.1, 100 Mbit/s, fp32: **{best}** ({listing})")
    for model in sorted({e["model"] for e in entries}):
        one = get(model=model, mode="single", nodes=1)
        if one is None or one.get("post_ms") is None:
            continue
        for n, r in ((2, 0.1), (4, 0.1)):
            s = get(model=model, mode="disco", nodes=n, ratio_target=r, codec="fp32", bandwidth_mbit=100,
                    shaping="pacing")
            if s:
                p, t = one["post_ms"], s["latency_ms_median"]
                out.append(f"- {model}, leader's post-processing (box decoding + NMS, 1 thread, random weights): "
                           f"{p:.1f} ms = **{100 * p / (t + p):.1f}%** of N={n} DISCO r={r:g} at 100 Mbit/s "
                           f"({t:.0f} ms + {p:.1f} ms)")
    ratios = [e["latency_ms_median"] / e["predicted_ms"] for e in entries
              if e.get("latency_ms_median") and e.get("predicted_ms")]
    if ratios:
        bad = sum(1 for x in ratios if x > 1.25 or x < 1 / 1.25)
        out.append(f"- measured / predicted over {len(ratios)} measurements: median {statistics.median(ratios):.2f}, "
                   f"range {min(ratios):.2f}..{max(ratios):.2f}; {bad} outside 1/1.25..1.25")
    return out


def latency_bench(data: dict) -> str:
    """bench/README.md's report: the host and calibration, the headlines, then every measured entry and every
    entry the latency model only predicted."""
    es = data["entries"]
    order = {"single": 0, "dense": 1, "disco": 2, "separated": 3}
    big = "resnet50" if any(e["model"] == "resnet50" for e in es) else es[0]["model"]
    es = sorted(es, key=lambda e: (e["model"] != big, e["nodes"], order[e["mode"]],
                                   -(e.get("ratio_target") or 0), {"fp32": 0, "fp16": 1}.get(e.get("codec"), 0),
                                   e["bandwidth_mbit"] if e["bandwidth_mbit"] is not None else 1e9,
                                   e.get("shaping") or ""))
    head = ["| model | mode | N | r | codec | link | shaping | measured ms | predicted ms | no-overlap ms "
            "| meas/pred | bytes sent | weights/node max | peak RSS/node max | rel. err | timed |",
            "|" + "---|" * 16]
    rows = ["### Measured", "", *head]
    measured = [e for e in es if e.get("latency_ms_median") is not None or e.get("error")]
    rest = [e for e in es if e not in measured]
    for e in measured + [None] + rest:
        if e is None:
            if not rest:
                break
            rows += ["", "### Not measured (latency model only)", "", *head]
            continue
        bw = "loopback" if e["bandwidth_mbit"] is None else f"{e['bandwidth_mbit']:g} Mbit/s"
        meas = e.get("latency_ms_median")
        pred = e.get("predicted_ms")
        ratio = "-" if not (meas and pred) else f"{meas / pred:.2f}"
        wb = e.get("weight_bytes_per_node")
        rss = e.get("peak_rss_mb_per_node")
        err = e.get("max_rel_err_vs_single_process")
        r = e.get("ratio")
        rows.append(
            f"| {e['model']} | {e['mode']} | {e['nodes']} | {'-' if r is None else f'{r:.3f}'} "
            f"| {e.get('codec') or '-'} | {bw} | {e.get('shaping') or '-'} "
            f"| {('failed' if e.get('error') else '-') if meas is None else f'{meas:.1f}'} | {_f(pred, '{:.1f}')} "
            f"| {_f(e.get('predicted_ms_no_overlap'), '{:.1f}')} | {ratio} "
            f"| {_f(e.get('bytes_sent_total'), '{:,}')} | {'-' if not wb else f'{max(wb) / 1e6:.2f} MB'} "
            f"| {'-' if not rss else f'{max(rss):.0f} MB'} | {_f(err, '{:.1e}')} | {e.get('n_timed') or '-'} |")
    meta = data["meta"]

    def cal_line(k: str) -> str:
        c = meta.get(k, {})
        return f"{c.get('a_s', 0) * 1e6:.0f} us + {c.get('b_s_per_byte', 0) * 1e9:.2f} ns/byte"

    lines = [
        "_Generated by `recipes/tables.py` from results/latency.json._", "",
        f"Host: {meta.get('host_cpus')} CPUs, {meta.get('threads_per_node')} thread per node, torch "
        f"{meta.get('torch')}. Link model: {meta.get('link_model')}. Kernel shaping: {meta.get('tc')}.",
        f"Per-message delay d(S) = a + b*S fitted on gloo ping-pongs through DistTransport: idle cores "
        f"{cal_line('delay')} (through the pacing thread {cal_line('delay_paced')}); both ends computing "
        f"between messages {cal_line('delay_loaded')} (paced {cal_line('delay_loaded_paced')}). The model uses "
        f"the {meta.get('delay_model', 'loaded')} ones.", "",
        *headlines(es, big), "", *rows,
    ]
    return "\n".join(lines)


def plot_latency(data: dict, plot: Path) -> None:
    """Latency against link bandwidth (the big model, N=2 and N=4): markers measured, faint lines predicted."""
    es = data["entries"]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model = "resnet50" if any(e["model"] == "resnet50" for e in es) else es[0]["model"]
    loop_x = 10_000  # where "unshaped loopback" sits on the bandwidth axis
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    colors = {1.0: "C3", 0.2: "C0", 0.1: "C2", 0.05: "C4", 0.0: "C7"}
    single = next((e for e in es if e["model"] == model and e["mode"] == "single"), None)
    for ax, n in zip(axes, (2, 4), strict=True):
        for (r, codec), c in [((r, cd), colors[r]) for r in LATENCY_RATIOS for cd in LATENCY_CODECS]:
            sel = [e for e in es if e["model"] == model and e["nodes"] == n and e.get("ratio_target") == r
                   and e.get("codec") == codec and e.get("shaping") in ("pacing", None)]
            if not sel:
                continue
            sel.sort(key=lambda e: e["bandwidth_mbit"] or loop_x)
            xs = [e["bandwidth_mbit"] or loop_x for e in sel]
            ls = "-" if codec == "fp32" else "--"
            name = {1.0: "dense", 0.0: "separated"}.get(r, f"DISCO r={r}")
            ax.plot(xs, [e["predicted_ms"] for e in sel], ls, color=c, alpha=0.35, lw=1)
            m = [(x, e["latency_ms_median"]) for x, e in zip(xs, sel, strict=True) if e["latency_ms_median"]]
            if m:
                ax.plot(*zip(*m, strict=True), "o" + ls, color=c, label=f"{name} {codec}", ms=4)
            else:
                ax.plot([], [], ls, color=c, alpha=0.35, label=f"{name} {codec} (predicted)")
        tc = [e for e in es if e["model"] == model and e["nodes"] == n and e.get("shaping") == "tc"
              and e["latency_ms_median"]]
        if tc:
            ax.plot([e["bandwidth_mbit"] for e in tc], [e["latency_ms_median"] for e in tc], "k^", ms=7, mfc="none",
                    label="kernel tc (veth, netns)")
        if single:
            ax.axhline(single["latency_ms_median"], color="k", ls=":", lw=1, label="1 process (PyTorch)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks([10, 100, 1000, loop_x], ["10", "100", "1000", "loopback"])
        ax.set_xlabel("link bandwidth per node (Mbit/s)")
        ax.set_title(f"{model}, N={n}: markers measured, faint lines predicted")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("latency per inference (ms)")
    axes[1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(plot, dpi=120)
    plt.close(fig)


ALL = tuple(HEADLINE)  # a renderer over several results files gets {name: entries}

def imagenette_resnet(entries: list[dict]) -> str:
    """Imagenette (torchvision ResNet): top-1 and top-5 beside the cost of each split."""
    dense = next(e for e in entries if e["name"] == "dense")
    rows = ["| run | N | selection | epochs | r (achieved) | top-1 % | vs dense | top-5 % | KB moved / image | "
            "FLOPs vs dense | weights / node vs whole |", "|" + "---|" * 11]
    for e in sorted(entries, key=lambda e: (e["nodes"], -e["ratio"], e["name"])):
        if e["name"] == "dense":
            rows.append(f"| dense (one device) | 1 | - | {e['epochs']} | 1 | {e['top1']:.2f} | - | {e['top5']:.2f} "
                        "| - | 1.00 | 1.00 |")
            continue
        rows.append(
            f"| {e['name']} | {e['nodes']} | {e['selection']} | {e['epochs']} | {e['ratio']:.3f} | {e['top1']:.2f} | "
            f"{e['top1'] - dense['top1']:+.2f} | {e['top5']:.2f} | {e['bytes'] / 1e3:.1f} (dense "
            f"{e['dense_bytes'] / 1e3:.1f}) | {e['flops_total'] / e['flops_dense']:.2f} | "
            f"{max(e['params_per_node']) / e['params_dense']:.2f} |")
    return "\n".join(rows)


def imagenette_summary(entries: list[dict]) -> str:
    """The issue's check (N=2, r=0.2 within 2 points of dense and above separated branches), from the JSON."""
    by = {e["name"]: e for e in entries}
    d = by["dense"]
    lines = [f"- Dense: {d['top1']:.2f} top-1 after {d['epochs']} epochs from random weights "
             f"at {d.get('image_size', '?')} px."]
    if "n2_r0.2" in by:
        e = by["n2_r0.2"]
        gap = e["top1"] - d["top1"]
        lines.append(f"- N=2, r=0.2: {gap:+.2f} points vs dense ({'within' if gap >= -2 else 'not within'} 2 points)"
                     + (f", {e['top1'] - by['n2_r0']['top1']:+.2f} vs separated branches ({by['n2_r0']['top1']:.2f})"
                        if "n2_r0" in by else "") + ".")
    return "\n".join(lines)


# page marker -> (results JSON name(s), table renderer)
# ---- reliability (bench/faults.py, bench/soak.py): docs/faults.md ------------------------------------------------

def faults_table(data: dict) -> str:
    """One row per fault case: exit code, seconds to the message and to the exit, the message, leftovers."""
    rows = [f"Every run: `--timeout {data['timeout_s']:g}`, {data['model']} over {data['nodes']} nodes "
            f"(`{data['command'].strip()}`). Seconds count from the fault (from the start for refusals); "
            "\"exit\" adds the launcher's own interpreter teardown.", "",
            "| case | exit code (expected) | s to message | s to exit | message | leftovers (processes, files) |",
            "|" + "---|" * 6]
    for c in data["cases"]:
        msg = c["message"].replace("|", "\\|")
        msg = msg if len(msg) <= 160 else msg[:157] + "..."
        code = f"{c['exit_code']}" + ("" if c["exit_code"] == c["expected"] else f" ({c['expected']}!)")
        rows.append(f"| {c['what']} | {code} | {c['seconds']:.1f} | {c['seconds_to_exit']:.1f} | {msg} | "
                    f"{c['leftover_processes']}, {c['leftover_files']} |")
    bad = [c["case"] for c in data["cases"] if not c["ok"]]
    rows += ["", f"{len(data['cases']) - len(bad)} of {len(data['cases'])} cases as expected"
             + (f"; not: {', '.join(bad)}" if bad else "") + "."]
    return "\n".join(rows)


def soak_table(data: dict) -> str:
    """Per node: RSS after warm-up and at the end of a long stream, the largest deviation and the slope."""
    rows = [f"{data['inferences']} inferences, `--stream {data['stream']}`, {data['model']} over {data['nodes']} "
            f"nodes (`{data['command']}`); the first {data['warmup_fraction']:.0%} of the stream is warm-up.", "",
            "| node | RSS after warm-up (MB) | RSS at the end (MB) | largest deviation | growth per inference | "
            f"within {data['tolerance']:.0%} |", "|" + "---|" * 6]
    for j, n in enumerate(data["per_node"]):
        rows.append(f"| {j} | {n['rss_mb_after_warmup']:.1f} | {n['rss_mb_end']:.1f} | {n['max_deviation_pct']:.2f}% "
                    f"| {n['growth_kb_per_inference']:+.3f} KB | {'yes' if n['flat'] else 'no'} |")
    return "\n".join(rows)
LEARNED = ("magnitude", "taylor", "lasso")


def selection_groups(entries: list[dict]) -> dict[tuple, list[dict]]:
    """Runs of results/cifar10_selection.json by (budget, N, target r, selection, epochs, subset)."""
    out: dict[tuple, list[dict]] = {}
    for e in entries:
        budget = e["budget"] + (f", latency weight {e['latency_weight']:g}" if e.get("latency_weight") else "")
        k = (budget, e["nodes"], e["target_ratio"], e["selection"], e["epochs"], e["train_subset"])
        out.setdefault(k, []).append(e)
    return out


def _ms(xs: list[float]) -> tuple[float, float]:
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def selection_table(entries: list[dict]) -> str:
    """Mean and std of top-1 per selection and setting, and the difference to random links."""
    groups = selection_groups(entries)
    rows = ["| budget | N | r | selection | seeds | top-1 mean | std | vs random | fine-tuning |",
            "|---|---|---|---|---|---|---|---|---|"]
    order = sorted(groups, key=lambda k: (k[0], -k[1], -k[2], k[4], k[5] or 0,
                                          ["random", *LEARNED].index(k[3]) if k[3] in LEARNED + ("random",) else 9))
    for k in order:
        budget, n, r, sel, ep, sub = k
        m, sd = _ms([e["top1"] for e in groups[k]])
        rnd = groups.get((budget, n, r, "random", ep, sub))
        vs = f"{m - _ms([e['top1'] for e in rnd])[0]:+.2f}" if rnd and sel != "random" else ""
        ft = f"{ep} epochs on {sub} images" if sub else f"{ep} epochs"
        rows.append(f"| {budget} | {n} | {r:g} | {sel} | {len(groups[k])} | {m:.2f} | {sd:.2f} | {vs} | {ft} |")
    return "\n".join(rows)


def selection_verdict(entries: list[dict], nodes: int = 4, ratio: float = 0.1) -> str:
    """Does the best learned selection beat random by >= 1 point, mean - std above random's mean + std?"""
    groups = selection_groups(entries)
    lines = []
    for k in sorted(g for g in groups if g[1] == nodes and g[2] == ratio and g[3] == "random"):
        rnd = _ms([e["top1"] for e in groups[k]])
        learned = [(sel, _ms([e["top1"] for e in groups[(k[0], k[1], k[2], sel, k[4], k[5])]]))
                   for sel in LEARNED if (k[0], k[1], k[2], sel, k[4], k[5]) in groups]
        if not learned:
            continue
        sel, (m, sd) = max(learned, key=lambda x: x[1][0])
        n_seeds = len(groups[(k[0], k[1], k[2], sel, k[4], k[5])])
        ok = m - rnd[0] >= 1.0 and m - sd > rnd[0] + rnd[1]
        verdict = ("met" if ok else "not met") if min(n_seeds, len(groups[k])) >= 3 else "undecided (< 3 seeds)"
        lines.append(f"N={nodes}, r={ratio:g} ({k[0]} budget, {k[4]} epochs on {k[5]} images): best learned "
                     f"selection {sel} {m:.2f} +- {sd:.2f} ({n_seeds} seeds) vs random {rnd[0]:.2f} +- {rnd[1]:.2f} "
                     f"({len(groups[k])} seeds): {m - rnd[0]:+.2f} points; target (>= +1.0 and mean - std above "
                     f"random's mean + std) {verdict}.")
    return "\n".join(lines) if lines else "No N=4, r=0.1 runs yet."


def budget_comparison(entries: list[dict]) -> str:
    """The joint budget, or a latency weight, against the plain global budget at equal selection, r and
    fine-tuning: accuracy, FLOPs, weights and messages per inference."""
    groups = selection_groups(entries)
    lines = []
    for k in sorted(g for g in groups if g[0] != "global"):
        ref = groups.get(("global", *k[1:]))
        if not ref:
            continue

        def prof(runs: list[dict]) -> str:
            m, sd = _ms([e["top1"] for e in runs])
            e = runs[0]
            return (f"{m:.2f} +- {sd:.2f} ({len(runs)} seeds; r {e['ratio']:.3f}, "
                    f"FLOPs {e['flops_total'] / e['flops_dense']:.2f}x, "
                    f"weights per node at most {max(e['params_per_node']) / e['params_dense']:.2f}x of the model"
                    + (f", {e['messages_per_inference']} messages per inference" if e.get("messages_per_inference")
                       else "") + ")")

        d = _ms([e["top1"] for e in groups[k]])[0] - _ms([e["top1"] for e in ref])[0]
        lines.append(f"N={k[1]}, r={k[2]:g}, {k[3]} selection, {k[4]} epochs on {k[5]} images: {k[0]} "
                     f"{prof(groups[k])} against global {prof(ref)}: {d:+.2f} points.")
    return "\n".join(lines) if lines else "No joint-budget runs yet."


def plot_selection(entries: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = selection_groups(entries)
    settings = sorted({(k[0], k[1], k[2]) for k in groups}, key=lambda s: (s[0], -s[1], -s[2]))
    sels = ["random", *LEARNED]
    fig, ax = plt.subplots(figsize=(max(5, 2 + 1.6 * len(settings)), 4))
    for i, sel in enumerate(sels):
        xs, ms, sds = [], [], []
        for j, st in enumerate(settings):
            runs = [e for k, v in groups.items() if (k[0], k[1], k[2]) == st and k[3] == sel for e in v]
            if runs:
                m, sd = _ms([e["top1"] for e in runs])
                xs.append(j + (i - 1.5) * 0.18)
                ms.append(m)
                sds.append(sd)
                ax.scatter([xs[-1]] * len(runs), [e["top1"] for e in runs], s=8, color=f"C{i}", alpha=0.5)
        if xs:
            ax.errorbar(xs, ms, yerr=sds, fmt="o", capsize=4, color=f"C{i}", label=sel)
    ax.set_xticks(range(len(settings)), [f"{b}\nN={n}, r={r:g}" for b, n, r in settings])
    ax.set_ylabel("CIFAR-10 top-1 (%)")
    ax.set_xlim(-0.6, len(settings) - 0.4)
    ax.set_title("Which links to keep (mean +- std over seeds; dots: runs)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def latency_weight_table(rows: list[dict]) -> str:
    """Per latency weight: messages, predicted latency and, where run (``--measure``), the measured median."""
    out = ["| model | N | link | r | latency weight | messages / inference | predicted ms | communication only ms "
           "| measured ms (disco run) |", "|---|---|---|---|---|---|---|---|---|"]
    for e in rows:
        w = "none" if not e["latency_weight_x"] else f"{e['latency_weight_x']:g} x latency x bandwidth"
        m = f"{e['measured_ms']:.0f}" if e.get("measured_ms") is not None else "not run"
        out.append(f"| {e['model']} | {e['nodes']} | {e['bandwidth_mbit']:g} Mbit/s, {e['latency_ms']:g} ms | "
                   f"{e['ratio']:.3f} | {w} | {e['messages_per_inference']} | {e['predicted_ms']:.0f} | "
                   f"{e['predicted_ms_communication_only']:.0f} | {m} |")
    return "\n".join(out)


def planner_validation(data: dict) -> str:
    """Each unseen setting: the planner's recommendation, predicted (as calibrated, and with ``--time-host``)
    and measured ms, and the host's speed against the calibration's."""
    out = ["| model | input | link | N offered | recommended | predicted ms | measured ms | measured / predicted "
           "| predicted ms, --time-host | measured / predicted, --time-host |", "|" + "---|" * 10]
    for e in data["entries"]:
        s, r = e["setting"], e["recommended"]
        rec = f"N={r['nodes']}, r={r['ratio_target']:g}, {r['codec']}" + (
            f", shares {','.join(f'{x:g}' for x in r['shares'])}" if r.get("shares") else "")
        th = (f"{e['predicted_ms_time_host']:.1f} | {e['measured_over_predicted_time_host']:.2f}"
              if "predicted_ms_time_host" in e else "- | -")
        out.append(f"| {s['model']} | {s['input_shape']} | {s['bandwidth']}, {s['latency']} | {s['nodes']} | {rec} | "
                   f"{e['predicted_ms']:.1f} | {e['measured_ms']:.1f} | {e['measured_over_predicted']:.2f} | {th} |")

    def within(key: str) -> str:
        ratios = [e[key] for e in data["entries"] if key in e]
        n = sum(1 for x in ratios if 1 / 1.25 <= x <= 1.25)
        return f"{n} of {len(ratios)} within 1.25x (measured / predicted from {min(ratios):.2f} to {max(ratios):.2f})"

    out += ["", f"As calibrated: {within('measured_over_predicted')}."]
    if any("measured_over_predicted_time_host" in e for e in data["entries"]):
        out.append(f"With `--time-host`: {within('measured_over_predicted_time_host')}.")
    h = data.get("host_check")
    if h:
        slow = ", ".join(f"{m} {v['one_process_ms_now']:.1f} ms against {v['quiet_ms']:.1f} ms in results/latency.json "
                         f"({v['slowdown']:.1f}x)" for m, v in h.items() if isinstance(v, dict))
        out.append(f"Host check after the runs ({h['time']}, load {h['loadavg_1min']}): one process {slow}.")
    return "\n".join(out)


def placement_table(rows: list[dict]) -> str:
    """Dense bytes per image at N=2 with channels sent after the channel-local ops (the sender applies them)
    and before them (the receiver applies them: exchange placement)."""
    out = ["| model | input | N | bytes, sender applies (MB) | bytes, receiver applies (MB) | saving |",
           "|---|---|---|---|---|---|"]
    for e in rows:
        out.append(f"| {e['model']} | {'x'.join(map(str, e['input_shape']))} | {e['nodes']} | "
                   f"{e['dense_bytes_sender'] / 1e6:.1f} | {e['dense_bytes_receiver'] / 1e6:.1f} | "
                   f"{e['saving']:.1%} |")
    return "\n".join(out)


TABLES = {
    "cifar10_resnet": ("cifar10_resnet", cifar10_resnet),
    "cifar10_summary": ("cifar10_resnet", cifar10_summary),
    "cifar10_vit": ("cifar10_vit", cifar10_resnet),
    "cifar10_vit_summary": ("cifar10_vit", cifar10_vit_summary),
    "cifar10_vit_size": ("cifar10_vit", model_size),
    "sr_rrdbnet": ("sr_rrdbnet", sr_rrdbnet),
    "sr_summary": ("sr_rrdbnet", sr_summary),
    "sr_size": ("sr_rrdbnet", model_size),
    "seg_deeplabv3plus": ("seg_deeplabv3plus", seg_deeplabv3plus),
    "seg_summary": ("seg_deeplabv3plus", seg_summary),
    "seg_size": ("seg_deeplabv3plus", model_size),
    "det_ssd": ("det_ssd", det_ssd),
    "det_summary": ("det_ssd", det_summary),
    "det_size": ("det_ssd", model_size),
    "det_lr": ("det_ssd_lr", det_lr),
    "det_ssd_small": ("det_ssd_small", det_ssd),
    "det_small_summary": ("det_ssd_small", det_summary),
    "det_small_size": ("det_ssd_small", model_size),
    "imagenette_resnet": ("imagenette_resnet", imagenette_resnet),
    "imagenette_summary": ("imagenette_resnet", imagenette_summary),
    "latency": ("latency", latency_headline),
    "latency_short": ("latency", latency_short),
    "latency_bench": ("latency", latency_bench),
    "headline": (ALL, headline),
    "faults": ("faults", faults_table),
    "soak": ("soak", soak_table),
    "selection": ("cifar10_selection", selection_table),
    "selection_verdict": ("cifar10_selection", selection_verdict),
    "budget_comparison": ("cifar10_selection", budget_comparison),
    "latency_weight": ("latency_weight", latency_weight_table),
    "planner_validation": ("planner_validation", planner_validation),
    "placement": ("placement", placement_table),
}
# results JSON name -> plot written next to it as NAME.png
PLOTS = {"cifar10_resnet": plot_cifar10, "cifar10_vit": plot_cifar10_vit, "sr_rrdbnet": plot_sr,
         "seg_deeplabv3plus": plot_seg, "det_ssd": plot_det, "latency": plot_latency,
         "cifar10_selection": plot_selection}
MARKER = re.compile(r"(<!-- table:(\w+) -->\n).*?(<!-- /table:\2 -->)", re.S)


def pages(root: Path = ROOT) -> list[Path]:
    """The pages whose markers are generated: README.md, docs/*.md and bench/README.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md")), root / "bench" / "README.md"]


def render(text: str, results: Path) -> str:
    """``text`` with every marker's body regenerated from the JSON in ``results`` (a marker whose JSON is
    missing is left as it is; an unknown marker is an error)."""
    cache: dict[str, object] = {}

    def load(name: str) -> object:
        if name not in cache:
            f = results / f"{name}.json"
            cache[name] = json.loads(f.read_text()) if f.is_file() else None
        return cache[name]

    def body(m: re.Match) -> str:
        if m.group(2) not in TABLES:
            raise KeyError(f"unknown table marker {m.group(2)!r} (known: {', '.join(TABLES)})")
        source, table = TABLES[m.group(2)]
        if isinstance(source, tuple):
            data = {s: load(s) for s in source if load(s) is not None}
        else:
            data = load(source)
            if data is None:
                return m.group(0)
        return m.group(1) + table(data) + "\n" + m.group(3)

    return MARKER.sub(body, text)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=str(ROOT / "results"), help="folder of the JSON files and plots")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page differs from the JSON")
    p.add_argument("--no-plots", action="store_true", help="rewrite the pages only")
    p.add_argument("--pages", "--readme", nargs="+", type=Path,
                   help="fill these pages (default: README.md and docs/*.md); a missing one is skipped")
    args = p.parse_args()
    results = Path(args.results)
    stale = []
    for page in args.pages or pages():
        if not page.is_file():
            continue
        text = page.read_text()
        new = render(text, results)
        if new != text:
            stale.append(page)
            if not args.check:
                page.write_text(new)
    if args.check:
        for page in stale:
            print(f"{page} is not what the JSON gives: run python recipes/tables.py")
        return 1 if stale else 0
    if not args.no_plots:
        for name, plot in PLOTS.items():
            src = results / f"{name}.json"
            if src.is_file():
                plot(json.loads(src.read_text()), results / f"{name}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
