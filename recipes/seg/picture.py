"""One CamVid test image side by side: image, label, dense, DISCO N=2 r=0.1, separated (N=2 r=0) predictions.

    python recipes/seg/picture.py --runs runs/seg --data ../shared/data/camvid --out results/seg_deeplabv3plus_test.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipes"))
from common import save_figure  # noqa: E402

PANELS = (("dense", "dense"), ("n2_r0.1", "DISCO N=2, r=0.1"), ("n2_r0", "separated N=2 (r=0)"))
# SegNet's display colours for classes 0..10; void (ignored) is black
PALETTE = torch.tensor([(128, 128, 128), (128, 0, 0), (192, 192, 128), (128, 64, 128), (60, 40, 222),
                        (128, 128, 0), (192, 128, 128), (64, 64, 128), (64, 0, 128), (64, 64, 0), (0, 128, 192)],
                       dtype=torch.uint8)


def colorize(label: torch.Tensor) -> torch.Tensor:
    """[H,W] class indices (255 = void) -> [H,W,3] uint8 colours."""
    out = torch.zeros(*label.shape, 3, dtype=torch.uint8)
    known = label < len(PALETTE)
    out[known] = PALETTE[label[known].long()]
    return out


@torch.no_grad()
def make_picture(runs: str | Path, data: str | Path, out: str | Path, index: int = 40,
                 limit: int | None = None) -> Path:
    """Render the panels from the checkpoints in ``runs``; each prediction's title carries its image mIoU."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch.nn.functional as F

    from disco.data.seg import load_split, normalize
    from disco.loading import load
    from disco.tasks import get_task
    from disco.tasks.seg import confusion, seg_metrics

    task = get_task("camvid")
    samples = load_split(data, task.eval_split, len(task.classes), limit=limit, keep_labels=True)
    name, full, label = samples[index % len(samples)]
    small = F.interpolate(full[None].float(), scale_factor=task.base_scale, mode="bilinear", antialias=True,
                          align_corners=False).round().clamp(0, 255).to(torch.uint8)
    panels = [(f"test image {name}", full.permute(1, 2, 0)), ("label (void black)", colorize(label))]
    for run, title in PANELS:
        ckpt = Path(runs) / f"{run}.safetensors"
        if ckpt.is_file():
            logits = load(ckpt).model(normalize(small))
            pred = F.interpolate(logits, size=label.shape, mode="bilinear", align_corners=False).argmax(1)[0]
            miou = seg_metrics(confusion(pred, label, len(task.classes)), task.classes)["miou"]
            panels.append((f"{title}\nmIoU {miou:.1f} (this image)", colorize(pred)))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 2.9))
    for ax, (title, img) in zip(axes, panels, strict=True):
        ax.imshow(img.numpy())
        ax.set_title(title, fontsize=8)
        ax.axis("off")
    return save_figure(fig, out, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default=str(ROOT / "runs" / "seg"))
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "camvid"))
    p.add_argument("--out", default=str(ROOT / "results" / "seg_deeplabv3plus_test.png"))
    p.add_argument("--image", type=int, default=40, help="index of the test image")
    args = p.parse_args()
    print(make_picture(args.runs, args.data, args.out, args.image))


if __name__ == "__main__":
    main()
