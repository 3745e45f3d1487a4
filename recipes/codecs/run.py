"""Accuracy of the wire codecs (fp32, fp16, bf16, int8) for every task's committed DISCO checkpoints.

    OMP_NUM_THREADS=1 .venv/bin/python recipes/codecs/run.py               # resumable; results/codecs.json
    .venv/bin/python -m recipes.pages                                      # docs/codecs.md from the JSON

Each checkpoint is evaluated through its node plans (:class:`disco.runtime.local.SplitModel`: the N
executors as threads of one process, the codec applied to every exchange exactly as ``disco run``
applies it, per sample as at the exported batch size of 1), on its task's test split. The fp32 row
must equal the checkpoint's own metric (the split computes the DISCO model's function).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"
OUT = ROOT / "results" / "codecs.json"
CODECS = ["fp32", "fp16", "bf16", "int8"]
# checkpoint in src/disco/assets, data folder, the metrics to report (first = headline), eval limit (None: all)
RUNS = [
    ("cifar_resnet20_n2_r0.2", "cifar10", ["top1"], None),
    ("vit_cifar_n2_r0.2", "cifar10", ["top1"], None),
    ("rrdbnet_tiny_x4_n2_r0.1_taylor_ft300_lr1e-3", "", ["psnr_set5", "psnr_set14", "psnr_bsd100"], None),
    ("deeplabv3plus_tiny_camvid_n2_r0.1_ft150", "camvid", ["miou", "pixel_acc"], None),
    ("ssd_tiny_split_det_n2_r0.1_taylor", "", ["map", "map50"], None),
]
NOTES = [
    "detection: the checkpoint is runs/det/n2_r0.1_taylor.safetensors of `python recipes/det/run.py --data "
    "../shared/data --coco '' --only n2_r0.1_taylor --threads 1 --workers 1 --results /tmp/det` (the generated "
    "set, 500 test images), copied into src/disco/assets: the row n2_r0.1_taylor of results/det_ssd.json "
    "rerun with today's code (see the next line); COCO mAP@[.5:.95] and mAP@.5 in percent",
    "SR data: Set5, Set14 and BSD100 (the sr_x4 task's evaluation sets), PSNR on Y with a 4-pixel border shaved",
]


def evaluate(name: str, data: str, limit: int | None, codecs: list[str]) -> list[dict]:
    """One entry per codec; the node plans (one set per input shape) are shared by the codecs."""
    import torch

    from disco.loading import load
    from disco.models import build_model
    from disco.runtime.local import PerSample, SplitModel
    from disco.runtime.transport import get_codec
    from disco.tasks import get_task

    torch.set_num_threads(1)
    loaded = load(ROOT / "src" / "disco" / "assets" / f"{name}.safetensors")
    task = get_task(loaded.ckpt.task)
    _, test = task.loaders(str(DATA / data) if data else str(DATA), 64, limit=limit)
    plain = build_model(loaded.ckpt.model["name"], **loaded.ckpt.model.get("kwargs", {}))
    plain.load_state_dict(loaded.ckpt.state_dict)  # the masked weights: what the shards are cut from
    split = SplitModel(plain.eval(), loaded.partition, loaded.model.kept)
    out = []
    for codec in codecs:
        split.codec = PerSample(get_codec(codec))
        t0 = time.perf_counter()
        metrics = task.evaluate(split, test)
        e = {"checkpoint": f"src/disco/assets/{name}.safetensors", "task": task.name, "codec": codec,
             "nodes": loaded.partition.nodes, "ratio": round(loaded.model.ratio, 4), "limit": limit,
             "metrics": metrics, "saved_metrics": loaded.ckpt.info.get("metrics", {}),
             "seconds": round(time.perf_counter() - t0, 1), "loadavg_1min": round(os.getloadavg()[0], 2)}
        print(json.dumps(e), flush=True)
        out.append(e)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", help="comma-separated checkpoint names")
    ap.add_argument("--codecs", default=",".join(CODECS))
    args = ap.parse_args()
    data = json.loads(OUT.read_text()) if OUT.is_file() else {"entries": []}
    data["notes"] = NOTES
    sys.path.insert(0, str(ROOT / "src"))
    for name, folder, _, limit in RUNS:
        if args.only and name not in args.only.split(","):
            continue
        todo = [c for c in args.codecs.split(",") if not any(
            e["checkpoint"].endswith(f"/{name}.safetensors") and e["codec"] == c for e in data["entries"])]
        if todo:
            data["entries"] += evaluate(name, folder, limit, todo)
            OUT.write_text(json.dumps(data, indent=1))
    print("then: python -m recipes.pages (docs/codecs.md from the JSON)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
