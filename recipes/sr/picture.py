"""One Set14 image side by side: HR, bicubic, dense, DISCO N=2 r=0.1, separated (N=2 r=0).

    python recipes/sr/picture.py --runs runs/sr --data ../shared/data --out results/sr_rrdbnet_set14.png
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


@torch.no_grad()
def make_picture(runs: str | Path, data: str | Path, out: str | Path, image: str = "comic",
                 scale: int = 4, crop: tuple[int, int, int] | None = (80, 100, 96)) -> Path:
    """Render the panels from the checkpoints in ``runs``; each title carries the image's Y PSNR.

    ``crop`` = (x, y, size) in HR pixels adds a second row that zooms into that square.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from disco.data.sr import bicubic_down, bicubic_up, image_files, modcrop, quantize, read_rgb, to_float
    from disco.loading import load
    from disco.tasks.sr import psnr_y

    path = next((p for p in image_files(Path(data) / "set14") if p.stem == image), None)
    if path is None:
        raise FileNotFoundError(f"no Set14 image named {image!r} under {data}/set14")
    hr = to_float(modcrop(read_rgb(path), scale))
    lr = bicubic_down(hr, scale)
    panels = [("HR (ground truth)", hr, None), ("bicubic", bic := bicubic_up(lr, scale), psnr_y(bic, hr, scale))]
    for name, title in PANELS:
        ckpt = Path(runs) / f"{name}.safetensors"
        if ckpt.is_file():
            sr = quantize(load(ckpt).model(lr))
            panels.append((title, sr, psnr_y(sr, hr, scale)))
    from matplotlib.patches import Rectangle

    h, w = hr.shape[-2:]
    rows = 2 if crop else 1
    fig, axes = plt.subplots(rows, len(panels), squeeze=False,
                             figsize=(2.6 * len(panels) * w / max(h, w) + 0.5, 3.2 + 2.6 * (rows - 1)))
    for k, (title, img, psnr) in enumerate(panels):
        ax = axes[0, k]
        ax.imshow(img[0].permute(1, 2, 0).numpy())
        ax.set_title(title + (f"\n{psnr:.2f} dB" if psnr is not None else "\n(PSNR on Y)"), fontsize=8)
        ax.axis("off")
        if crop:
            x, y, size = crop
            ax.add_patch(Rectangle((x, y), size, size, fill=False, color="yellow", lw=1))
            axes[1, k].imshow(img[0, :, y:y + size, x:x + size].permute(1, 2, 0).numpy(), interpolation="nearest")
            axes[1, k].axis("off")
    fig.suptitle(f"Set14 '{image}', x{scale}", fontsize=9)
    return save_figure(fig, out, dpi=130)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default=str(ROOT / "runs" / "sr"))
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--out", default=str(ROOT / "results" / "sr_rrdbnet_set14.png"))
    p.add_argument("--image", default="comic")
    p.add_argument("--crop", default="80,100,96", help="x,y,size of the zoomed square in HR pixels ('' for none)")
    args = p.parse_args()
    crop = tuple(int(v) for v in args.crop.split(",")) if args.crop else None
    print(make_picture(args.runs, args.data, args.out, args.image, crop=crop))


if __name__ == "__main__":
    main()
