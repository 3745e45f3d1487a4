"""The task results tables (results/cifar10_*.json, sr_, seg_, det_, imagenette_) and the README's headline."""

from __future__ import annotations

from .md import md_table
from .runs import by_cost, lr_note, moved, separated_for, weights_share

COST_COLUMNS = ["KB moved / image", "FLOPs vs dense", "weights / node vs whole"]
DENSE_COST = ["-", "1.00", "1.00"]


def _cost(e: dict) -> list[str]:
    return [moved(e), f"{e['flops_total'] / e['flops_dense']:.2f}", f"{weights_share(e):.2f}"]


def _dense(entries: list[dict]) -> dict:
    return next(e for e in entries if e["name"] == "dense")


def cifar10_resnet(entries: list[dict]) -> str:
    """CIFAR-10 classification (ResNet-20, ViT): top-1 beside the cost of each split."""
    dense = _dense(entries)
    rows = []
    for e in by_cost(entries):
        if e is dense:
            rows.append(["dense (one device)", 1, "-", "-", e["epochs"], 1, f"{e['top1']:.2f}", "-", *DENSE_COST])
            continue
        rows.append([e["name"], e["nodes"], e["budget"], e["selection"], e["epochs"], f"{e['ratio']:.3f}",
                     f"{e['top1']:.2f}", f"{e['top1'] - dense['top1']:+.2f}", *_cost(e)])
    return md_table(rows, ["run", "N", "budget", "selection", "epochs", "r (achieved)", "top-1 %", "vs dense",
                           *COST_COLUMNS])


def sr_rrdbnet(entries: list[dict]) -> str:
    """Super-resolution x4: PSNR/SSIM (Y, shaved) per set, bicubic and dense first."""
    dense = _dense(entries)
    b5 = dense["bicubic_psnr_set5"]
    rows = [["bicubic", "-", "-", "-", "-", f"{b5:.2f}", f"{b5 - dense['psnr_set5']:+.2f}",
             f"{dense['bicubic_ssim_set5']:.4f}", f"{dense['bicubic_psnr_set14']:.2f}",
             f"{dense['bicubic_psnr_bsd100']:.2f}", "-", "-", "-"]]
    for e in by_cost(entries):
        sets = [f"{e['ssim_set5']:.4f}", f"{e['psnr_set14']:.2f}", f"{e['psnr_bsd100']:.2f}"]
        if e is dense:
            rows.append(["dense (one device)", 1, "-", e["epochs"], 1, f"{e['psnr_set5']:.2f}", "-", *sets,
                         *DENSE_COST])
            continue
        rows.append([e["name"], e["nodes"], e["selection"], e["epochs"], f"{e['ratio']:.3f}", f"{e['psnr_set5']:.2f}",
                     f"{e['psnr_set5'] - dense['psnr_set5']:+.2f}", *sets, *_cost(e)])
    return md_table(rows, ["run", "N", "scores", "epochs", "r (achieved)", "Set5 PSNR (dB)", "vs dense", "Set5 SSIM",
                           "Set14 PSNR", "BSD100 PSNR", "KB moved / 24x24 LR input", *COST_COLUMNS[1:]])


def seg_deeplabv3plus(entries: list[dict]) -> str:
    """Segmentation: mIoU and pixel accuracy, then IoU per class (where communication matters)."""
    dense = _dense(entries)
    classes = list(dense["per_class_iou"])
    order = by_cost(entries)
    rows = []
    for e in order:
        if e is dense:
            rows.append(["dense (one device)", 1, e["epochs"], 1, f"{e['miou']:.2f}", "-", f"{e['pixel_acc']:.2f}",
                         *DENSE_COST])
            continue
        rows.append([e["name"], e["nodes"], e["epochs"], f"{e['ratio']:.3f}", f"{e['miou']:.2f}",
                     f"{e['miou'] - dense['miou']:+.2f}", f"{e['pixel_acc']:.2f}", *_cost(e)])
    main = md_table(rows, ["run", "N", "epochs", "r (achieved)", "mIoU %", "vs dense", "pixel acc. %", *COST_COLUMNS])
    iou = md_table([[e["name"], *("-" if e["per_class_iou"].get(c) is None else f"{e['per_class_iou'][c]:.1f}"
                                  for c in classes)] for e in order], ["run", *classes])
    return "\n".join([main, "", "IoU per class (%):", "", iou])


def _det_row(ds: str, e: dict, dense: dict | None) -> list[object]:
    note = " (evaluated on its training images)" if e.get("eval_on_train") else ""
    one = e["nodes"] == 1
    return [f"{ds}{note}", e["name"], e["nodes"], "-" if one else e["selection"], e.get("epochs") or "-",
            f"{e['ratio']:.3f}", f"{e['map']:.2f}", f"{e['map50']:.2f}",
            "-" if dense is None or e is dense else f"{e['map'] - dense['map']:+.2f}",
            "-" if e.get("post_ms") is None else f"{e['post_ms']:.1f}", "-" if one else moved(e),
            "1.00" if one else f"{e['flops_total'] / e['flops_dense']:.2f}"]


def det_ssd(entries: list[dict]) -> str:
    """Detection: COCO mAP@[.5:.95] and mAP@.5 per run, the generated set first, then coco128."""
    rows = []
    for ds in ("generated", "coco128"):
        sel = [e for e in entries if e["dataset"] == ds]
        dense = next((e for e in sel if e["nodes"] == 1), None)
        rows += [_det_row(ds, e, dense) for e in by_cost(sel)]
    return md_table(rows, ["data", "run", "N", "scores", "epochs", "r (achieved)", "mAP", "mAP@.5", "vs dense (mAP)",
                           "leader post-processing ms", "KB moved / image", "FLOPs vs dense"])


def det_lr(entries: list[dict]) -> str:
    """The detection fine-tuning rate sweep (recipes/det/lr_sweep.py): N=2, r = 1 and r = 0.1."""
    dense = next(e for e in entries if e["nodes"] == 1)
    rows = [["1 (every link kept)" if e["ratio"] >= 1 else f"{e['ratio']:.3f}", e["selection"], f"{e['lr']:g}",
             f"{e['distill']:g}", e["epochs"], f"{e['map']:.2f}", f"{e['map'] - dense['map']:+.2f}",
             f"{e['map50']:.2f}"] for e in entries if e["nodes"] > 1]
    return md_table(rows, ["r", "scores", "lr", "distillation", "epochs", "mAP", f"vs dense ({dense['map']:.2f})",
                           "mAP@.5"])


def imagenette_resnet(entries: list[dict]) -> str:
    """Imagenette (torchvision ResNet): top-1 and top-5 beside the cost of each split."""
    dense = _dense(entries)
    rows = []
    for e in by_cost(entries):
        if e is dense:
            rows.append(["dense (one device)", 1, "-", e["epochs"], 1, f"{e['top1']:.2f}", "-", f"{e['top5']:.2f}",
                         *DENSE_COST])
            continue
        rows.append([e["name"], e["nodes"], e["selection"], e["epochs"], f"{e['ratio']:.3f}", f"{e['top1']:.2f}",
                     f"{e['top1'] - dense['top1']:+.2f}", f"{e['top5']:.2f}", *_cost(e)])
    return md_table(rows, ["run", "N", "selection", "epochs", "r (achieved)", "top-1 %", "vs dense", "top-5 %",
                           *COST_COLUMNS])


def model_size(entries: list[dict]) -> str:
    """The size of a results file's dense model(s): parameters and FLOPs at the partition's input shape."""
    lines = []
    for d in (e for e in entries if e["nodes"] == 1):
        shape = "x".join(str(v) for v in d["input_shape"][1:]) if d.get("input_shape") else None
        at = f" at {shape}" if shape else " per image"
        lines.append(f"- `{d['model']}`: {d['params_per_node'][0] / 1e6:.2f} M parameters, "
                     f"{d['flops_total'] / 1e9:.3f} GFLOPs{at}.")
    return "\n".join(lines)


# the task and metric of each results file in the headline table: (label, metric key, unit)
HEADLINE = {
    "cifar10_resnet": ("CIFAR-10 classification", "top1", "top-1 %"),
    "cifar10_vit": ("CIFAR-10 classification", "top1", "top-1 %"),
    "sr_rrdbnet": ("x4 super-resolution", "psnr_set5", "Set5 PSNR dB"),
    "seg_deeplabv3plus": ("CamVid segmentation", "miou", "mIoU %"),
    "det_ssd": ("detection (generated set)", "map", "mAP"),
    "det_ssd_small": ("detection (generated set)", "map", "mAP"),
}
PRETRAINED = "imagenette_pretrained"  # its row comes first: a network pretrained on ImageNet, real photos


def headline(results: dict[str, list[dict]]) -> str:
    """One row per results file: dense, the best N=2 DISCO model at r = 0.1 and separated branches fine-tuned
    the same way, with the bytes each moves."""
    from .pretrained import headline_row

    first = headline_row(results[PRETRAINED]) if results.get(PRETRAINED) else None
    rows = [first] if first else []
    for name, (label, metric, unit) in HEADLINE.items():
        entries = [e for e in results.get(name, []) if e.get("dataset", "generated") == "generated"]
        dense = next((e for e in entries if e["nodes"] == 1), None)
        runs = [e for e in entries if e["nodes"] == 2 and e.get("target_ratio", e["ratio"]) == 0.1
                and e["selection"] != "random"]
        if dense is None or not runs:
            continue
        best = max(runs, key=lambda e: e[metric])
        sep = separated_for(best, [e for e in entries if e["nodes"] == 2 and e["ratio"] == 0])
        rows.append([label, f"`{dense['model']}`", unit, f"{dense[metric]:.2f}",
                     f"{best[metric]:.2f} ({best['selection']}, {best['epochs']} epochs{lr_note(best)})",
                     "-" if sep is None else f"{sep[metric]:.2f} ({sep['epochs']} epochs{lr_note(sep)})",
                     f"{best['bytes'] / 1e3:.1f} ({best['dense_bytes'] / 1e3:.1f})"])
    return md_table(rows, ["task", "model", "metric", "dense (1 device)", "DISCO N=2, r=0.1 (best run)",
                           "separated branches, N=2", "KB moved / input: DISCO (dense split)"])
