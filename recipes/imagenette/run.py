"""Imagenette (real ImageNet photos, 10 classes) with a torchvision ResNet-18: dense, then DISCO.

A small-data proxy for the paper's ImageNet ResNet-50 result: the shared imagenette224 copy has
1000 training and 500 validation images; the model is trained from random weights at a reduced
image size on CPUs. Every step is resumable; a finished run is skipped. The JSON goes to
results/imagenette_resnet.json (no checkpoint is committed: ResNet-18 weights are 45 MB).

    python recipes/imagenette/run.py --data ../shared/data/imagenette224
    python recipes/tables.py
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipes"))
from common import disco, sparsify_run  # noqa: E402

# (name, nodes, ratio)
RUNS = [
    ("n2_r0.2", 2, 0.2),
    ("n2_r0.1", 2, 0.1),
    ("n2_r0", 2, 0.0),
    ("n4_r0.2", 4, 0.2),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "imagenette224"))
    p.add_argument("--model", default="resnet18")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--dense-epochs", type=int, default=18)
    p.add_argument("--epochs", type=int, default=5, help="fine-tuning epochs of every DISCO run")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--distill", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers (0: decode in the main process)")
    p.add_argument("--runs", help="scratch run folder: the JSON goes there (default: runs/imagenette, JSON "
                                  "into results/)")
    p.add_argument("--only", nargs="*", help="run only these names (e.g. n2_r0.2)")
    args = p.parse_args()
    runs = Path(args.runs or ROOT / "runs" / "imagenette")
    runs.mkdir(parents=True, exist_ok=True)
    common = ["--batch-size", str(args.batch_size), "--workers", str(args.workers), "--device", "cpu"]

    dense = runs / "dense.safetensors"
    if not dense.is_file():
        disco("train", "--task", "imagefolder", "--data", args.data, "--model", args.model,
              "--image-size", str(args.image_size), "--epochs", str(args.dense_epochs), *common,
              "--out", str(dense), threads=args.threads)
    dense_eval = disco("eval", str(dense), "--data", args.data, "--workers", str(args.workers), "--json",
                       threads=args.threads)
    shape = f"1,3,{args.image_size},{args.image_size}"
    dense_cost = disco("cost", args.model, "--nodes", "2", "--input-shape", shape, "--json", threads=args.threads)

    for name, nodes, ratio in RUNS:
        if not args.only or name in args.only:
            sparsify_run(runs, dense, args.data, name, nodes, ratio, args.epochs,
                         ["--distill", str(args.distill), *common], threads=args.threads)
    results = [json.loads((runs / f"{r[0]}.json").read_text()) for r in RUNS if (runs / f"{r[0]}.json").is_file()]
    entries = [{
        "name": "dense", "model": args.model, "image_size": args.image_size, "nodes": 1, "ratio": 1.0,
        "budget": None, "selection": "dense", "top1": dense_eval["top1"], "top5": dense_eval["top5"], "bytes": 0,
        "dense_bytes_n2": dense_cost["dense_bytes"], "flops_total": dense_cost["flops_dense"],
        "params_per_node": [dense_cost["params_dense"]], "epochs": args.dense_epochs, "checkpoint": None,
    }]
    for r in results:
        entries.append({
            "name": r["name"], "model": args.model, "image_size": args.image_size, "nodes": r["nodes"],
            "ratio": r["ratio"], "target_ratio": r["target_ratio"], "budget": r["budget"],
            "selection": r["selection"], "top1": r["top1"], "top5": r["top5"], "bytes": r["bytes"],
            "dense_bytes": r["dense_bytes"], "flops_total": r["flops_total"], "flops_dense": r["flops_dense"],
            "params_per_node": r["params_per_node"], "params_dense": r["params_dense"],
            "epochs": r.get("epochs", args.epochs), "distill": args.distill, "checkpoint": None,
        })
    out = (ROOT / "results" if args.runs is None else runs) / "imagenette_resnet.json"
    out.write_text(json.dumps(entries, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
