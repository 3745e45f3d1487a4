"""The CIFAR-10 reproductions: a dense model, then DISCO at several N and r.

Two profiles: ``--model cifar_resnet20`` (the default; results/cifar10_resnet.json) and
``--model vit_cifar`` (a small ViT, patch 4; results/cifar10_vit.json).
Every step is resumable (each run checkpoints per epoch; a finished run is skipped).
Run ``python recipes/tables.py`` afterwards to refresh the plots and the tables of docs/.

    python recipes/cifar10/run.py --data ../shared/data/cifar10
    python recipes/cifar10/run.py --data ../shared/data/cifar10 --model vit_cifar
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipes"))
from common import disco, epochs_of, sparsify_run  # noqa: E402

ASSETS = ROOT / "src" / "disco" / "assets"

# (name, nodes, ratio, budget, selection[, fine-tuning epochs if not --epochs])
RUNS = [
    ("n2_r0.2", 2, 0.2, "global", "magnitude"),
    ("n2_r0.1", 2, 0.1, "global", "magnitude"),
    ("n2_r0.05", 2, 0.05, "global", "magnitude"),
    ("n2_r0", 2, 0.0, "global", "magnitude"),
    ("n2_r0.5", 2, 0.5, "global", "magnitude"),
    ("n2_r0.1_layer", 2, 0.1, "layer", "magnitude"),
    ("n2_r0.1_random", 2, 0.1, "global", "random"),
    ("n4_r0.1", 4, 0.1, "global", "magnitude"),
    ("n4_r0", 4, 0.0, "global", "magnitude"),
    ("n4_r0.2", 4, 0.2, "global", "magnitude"),
    # the next idea when r=0.2 misses the 1-point target: the same run with 3x the fine-tuning
    ("n2_r0.2_ft6", 2, 0.2, "global", "magnitude", 6),
    # and when magnitude does not beat random links: first-order (Taylor) scores
    ("n2_r0.1_taylor", 2, 0.1, "global", "taylor"),
]
VIT_RUNS = [
    ("n2_r0.2", 2, 0.2, "global", "magnitude"),
    ("n2_r0.1", 2, 0.1, "global", "magnitude"),
    ("n2_r0", 2, 0.0, "global", "magnitude"),
    ("n2_r0.5", 2, 0.5, "global", "magnitude"),
    ("n4_r0.2", 4, 0.2, "global", "magnitude"),
    ("n4_r0", 4, 0.0, "global", "magnitude"),
]
# per model: runs, result file, committed checkpoints, dense and fine-tuning flags
PROFILES = {
    "cifar_resnet20": {
        "runs": RUNS, "result": "cifar10_resnet.json", "subdir": "cifar10", "dense_epochs": 20, "epochs": 2,
        "committed": {"dense": "cifar_resnet20_dense.safetensors", "n2_r0.2": "cifar_resnet20_n2_r0.2.safetensors"},
        "train": [], "sparsify": [],
    },
    "vit_cifar": {  # AdamW, weight decay 0.05; lr 1e-3 dense, 5e-4 while sparsifying
        "runs": VIT_RUNS, "result": "cifar10_vit.json", "subdir": "cifar10_vit", "dense_epochs": 12, "epochs": 2,
        "committed": {"dense": "vit_cifar_dense.safetensors", "n2_r0.2": "vit_cifar_n2_r0.2.safetensors"},
        "train": ["--optimizer", "adamw", "--lr", "1e-3", "--wd", "0.05"],
        "sparsify": ["--optimizer", "adamw", "--lr", "5e-4", "--wd", "0.05"],
    },
}
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "cifar10"))
    p.add_argument("--model", default="cifar_resnet20", choices=sorted(PROFILES))
    p.add_argument("--runs", help="scratch run folder: the JSON goes there and no checkpoint is committed "
                                  "(default: runs/cifar10 or runs/cifar10_vit, JSON into results/)")
    p.add_argument("--dense-epochs", type=int, help="default: 20 (ResNet-20), 12 (ViT)")
    p.add_argument("--epochs", type=int, help="fine-tuning epochs of every DISCO run (default 2)")
    p.add_argument("--distill", type=float, default=0.5)
    p.add_argument("--workers", type=int, default=2, help="DISCO runs in parallel")
    p.add_argument("--threads", type=int, default=1, help="torch threads per DISCO run")
    p.add_argument("--dense-threads", type=int, default=2, help="torch threads of the dense training")
    p.add_argument("--only", nargs="*", help="run only these names (e.g. n2_r0.2)")
    args = p.parse_args()
    prof = PROFILES[args.model]
    args.dense_epochs = args.dense_epochs or prof["dense_epochs"]
    args.epochs = args.epochs or prof["epochs"]
    runs = Path(args.runs or ROOT / "runs" / prof["subdir"])
    runs.mkdir(parents=True, exist_ok=True)

    dense = runs / "dense.safetensors"
    if not dense.is_file():
        disco("train", "--data", args.data, "--model", args.model, "--epochs", str(args.dense_epochs),
              *prof["train"], "--eval-every", "--out", str(dense), threads=args.dense_threads)
    dense_eval = disco("eval", str(dense), "--data", args.data, "--json", threads=2)
    dense_cost = disco("cost", args.model, "--nodes", "2",
                       "--input-shape", "1,3,32,32", "--json", threads=2)

    def one(spec: tuple) -> dict:
        name, nodes, ratio, budget, selection = spec[:5]
        return sparsify_run(runs, dense, args.data, name, nodes, ratio, epochs_of(spec, args.epochs, at=5),
                            ["--distill", str(args.distill), *prof["sparsify"]], budget=budget, selection=selection,
                            threads=args.threads)

    todo = [r for r in prof["runs"] if not args.only or r[0] in args.only]
    with ThreadPoolExecutor(args.workers) as pool:
        list(pool.map(one, todo))
    # the JSON holds every finished run, also those of earlier invocations
    results = [json.loads((runs / f"{r[0]}.json").read_text()) for r in prof["runs"]
               if (runs / f"{r[0]}.json").is_file()]

    ASSETS.mkdir(parents=True, exist_ok=True)
    entries = [{
        "name": "dense", "model": args.model, "nodes": 1, "ratio": 1.0, "budget": None, "selection": "dense",
        "top1": dense_eval["top1"], "bytes": 0, "dense_bytes_n2": dense_cost["dense_bytes"],
        "flops_total": dense_cost["flops_dense"], "params_per_node": [dense_cost["params_dense"]],
        "epochs": args.dense_epochs, "checkpoint": None,
    }]
    for r in results:
        entries.append({
            "name": r["name"], "model": args.model, "nodes": r["nodes"], "ratio": r["ratio"],
            "target_ratio": r["target_ratio"], "budget": r["budget"], "selection": r["selection"],
            "top1": r["top1"], "bytes": r["bytes"], "dense_bytes": r["dense_bytes"],
            "stats_bytes": r.get("stats_bytes"), "flops_total": r["flops_total"],
            "flops_dense": r["flops_dense"], "params_per_node": r["params_per_node"],
            "params_dense": r["params_dense"], "epochs": r.get("epochs", args.epochs), "distill": args.distill,
            "checkpoint": None,
        })
    official = args.runs is None
    for e in entries:
        if official and e["name"] in prof["committed"]:
            src = dense if e["name"] == "dense" else runs / f"{e['name']}.safetensors"
            dst = ASSETS / prof["committed"][e["name"]]
            shutil.copyfile(src, dst)
            e["checkpoint"] = str(dst.relative_to(ROOT))
    out = (ROOT / "results" if official else runs) / prof["result"]
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(entries, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
