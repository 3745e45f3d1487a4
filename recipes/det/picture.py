"""Detections on a few generated test images: dense, DISCO N=2 r=0.1, separated (N=2 r=0); ground truth in green.

    python recipes/det/picture.py --runs runs/det --data ../shared/data --out results/det_ssd_test.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
PANELS = (("dense", "dense"), ("n2_r0.1", "DISCO N=2, r=0.1"), ("n2_r0", "separated N=2 (r=0)"))


@torch.no_grad()
def make_picture(runs: str | Path, data: str | Path, out: str | Path, images: tuple[int, ...] = (0, 1, 2, 3, 4),
                 score: float = 0.4, zoom: int = 2) -> Path:
    """One row per checkpoint in ``runs`` (PANELS), one column per test image; boxes above ``score``."""
    from PIL import Image, ImageDraw

    from disco.data.det import MEAN, STD, CocoDet
    from disco.loading import load
    from disco.tasks import get_task

    task = get_task("det_generated")
    test = CocoDet(task.folder(str(data)), "test", task.size, limit=max(images) + 1)
    x = torch.stack([test.image(k) for k in images]).float() / 255
    xn = (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    s, pad, head = task.size * zoom, 4, 18
    rows = [(n, t) for n, t in PANELS if (Path(runs) / f"{n}.safetensors").is_file()]
    canvas = Image.new("RGB", (len(images) * (s + pad) + pad, len(rows) * (s + pad + head) + pad), "white")
    draw = ImageDraw.Draw(canvas)
    for r, (name, title) in enumerate(rows):
        model = load(Path(runs) / f"{name}.safetensors").model
        outputs = model(xn)
        dets = task.post(outputs, model).detect(outputs, (task.size, task.size))
        y0 = pad + r * (s + pad + head)
        draw.text((pad, y0), title, fill="black")
        for c, (k, det) in enumerate(zip(images, dets, strict=True)):
            x0 = pad + c * (s + pad)
            img = Image.fromarray((x[c].permute(1, 2, 0) * 255).byte().numpy()).resize((s, s), Image.NEAREST)
            canvas.paste(img, (x0, y0 + head))
            t = test.target(k)
            for b in t["boxes"].tolist():
                draw.rectangle([x0 + b[0] * zoom, y0 + head + b[1] * zoom, x0 + b[2] * zoom, y0 + head + b[3] * zoom],
                               outline=(0, 200, 0))
            for b, sc, lab in zip(det["boxes"].tolist(), det["scores"].tolist(), det["labels"].tolist(), strict=True):
                if sc < score:
                    continue
                box = [x0 + b[0] * zoom, y0 + head + b[1] * zoom, x0 + b[2] * zoom, y0 + head + b[3] * zoom]
                draw.rectangle(box, outline=(230, 30, 30), width=2)
                draw.text((box[0] + 2, box[1] + 1), f"{test.names[lab - 1]} {sc:.2f}", fill=(255, 255, 0))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(out)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default=str(ROOT / "runs" / "det"))
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--out", default=str(ROOT / "results" / "det_ssd_test.png"))
    p.add_argument("--score", type=float, default=0.4)
    args = p.parse_args()
    print(f"wrote {make_picture(args.runs, args.data, args.out, score=args.score)}")


if __name__ == "__main__":
    main()
