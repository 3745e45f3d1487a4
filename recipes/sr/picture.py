"""One Set14 image side by side: HR, bicubic, dense, DISCO N=2 r=0.1, separated (N=2 r=0).

    python recipes/sr/picture.py --runs runs/sr --data ../shared/data --out results/sr_rrdbnet_set14.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
PANELS = (("dense", "dense"), ("n2_r0.1", "DISCO N=2, r=0.1"), ("n2_r0", "separated N=2 (r=0)"))


@torch.no_grad()
def make_picture(runs: str | Path, data: str | Path, out: str | Path, image: str = "comic",
                 scale: int = 4) -> Path:
    """Render the panels from the checkpoints in ``runs``; each title carries the image's Y PSNR."""
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
    h, w = hr.shape[-2:]
    fig, axes = plt.subplots(1, len(panels), figsize=(2.6 * len(panels) * w / max(h, w) + 0.5, 3.2))
    for ax, (title, img, psnr) in zip(axes, panels, strict=True):
        ax.imshow(img[0].permute(1, 2, 0).numpy())
        ax.set_title(title + (f"\n{psnr:.2f} dB" if psnr is not None else "\n(PSNR on Y)"), fontsize=8)
        ax.axis("off")
    fig.suptitle(f"Set14 '{image}', x{scale}", fontsize=9)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default=str(ROOT / "runs" / "sr"))
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--out", default=str(ROOT / "results" / "sr_rrdbnet_set14.png"))
    p.add_argument("--image", default="comic")
    args = p.parse_args()
    print(make_picture(args.runs, args.data, args.out, args.image))


if __name__ == "__main__":
    main()
