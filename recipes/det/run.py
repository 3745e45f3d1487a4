"""Object detection with a split SSD: dense, then DISCO at N=2 and N=4, on the generated set and coco128.

Every step is resumable (each run checkpoints per epoch; a finished run is skipped). Results go to
results/det_ssd.json (``map`` = COCO mAP@[.5:.95], ``map50`` = mAP@.5, in percent), the picture of
detections to results/det_ssd_test.png (the plot of mAP against r, results/det_ssd.png, is tables.py's).

    python recipes/det/run.py --data ../shared/data     # DATA holds cifar10/, imagenette224/, coco128/

* generated set (CIFAR-10 objects on Imagenette backgrounds, 128x128, 4000 train / 500 test
  images, generated into the cache on first use): ``ssd_tiny_split``, dense, then N=2 with
  r in {0.5, 0.2, 0.1, 0.05, 0} and N=4 with r in {0.1, 0} (global byte budget, magnitude links,
  distillation from the dense model on the head outputs);
* coco128 (real COCO 2017 images; trained and evaluated on the same 128 images, the customary use
  of that set): dense and N=2 r=0.1, at 320x320.

The same at twice the width (``ssd_small_split``, 64-channel stages: 32 per node at N=2), on the
generated set only, the rows of ``WIDE_RUNS``, for the capacity question of recipes/det/README.md;
results/det_ssd_small.json:

    python recipes/det/run.py --model ssd_small_split --runs runs/det_w64 --name det_ssd_small --coco '' --threads 1

Smoke run (tiny, into a scratch folder, nothing under results/):

    python recipes/det/run.py --limit 16 --dense-epochs 1 --epochs 1 --coco-dense-epochs 1 --coco-epochs 1 \\
        --batch-size 8 --runs /tmp/det/runs --results /tmp/det/results
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipes"))
from common import cached, disco, epochs_of, options_of, sparsify_run  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

# (name, nodes, ratio[, fine-tuning epochs if not --epochs][, sparsify_run options]); the global byte budget and
# magnitude selection unless the options say otherwise; r = 0: separated branches
RUNS = [
    ("n2_r1", 2, 1.0),  # control: every link kept, the same fine-tuning (what fine-tuning alone costs)
    ("n2_r0.5", 2, 0.5),
    ("n2_r0.2", 2, 0.2),
    ("n2_r0.1", 2, 0.1),
    ("n2_r0.05", 2, 0.05),
    ("n2_r0", 2, 0.0),
    ("n4_r0.1", 4, 0.1),
    ("n4_r0", 4, 0.0),
    # Taylor scores (first-order loss change per byte) instead of weight magnitude per byte
    ("n2_r0.1_taylor", 2, 0.1, {"selection": "taylor"}),
    ("n4_r0.1_taylor", 4, 0.1, {"selection": "taylor"}),
]
# the rows of --model ssd_small_split (twice the width): what the r = 0.1 success check needs
WIDE_RUNS = [
    ("n2_r1", 2, 1.0),
    ("n2_r0.1_taylor", 2, 0.1, {"selection": "taylor"}),
    ("n2_r0", 2, 0.0),
    # 3x the fine-tuning, and separated branches fine-tuned as long (the fair comparison for it)
    ("n2_r0.1_taylor_ft30", 2, 0.1, 30, {"selection": "taylor"}),
    ("n2_r0_ft30", 2, 0.0, 30),
    ("n2_r0.1_taylor_lr2e-3", 2, 0.1, {"selection": "taylor", "lr": 2e-3}),  # lr_sweep.py: 2e-3 beat 1e-3
    ("n2_r0_lr2e-3", 2, 0.0, {"lr": 2e-3}),  # separated branches at that rate: the fair comparison for it
]
COCO_RUNS = [("coco128_n2_r0.1", 2, 0.1)]
METRICS = ("map", "map50", "post_ms", "model_ms", "n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"),
                   help="folder holding cifar10/ and imagenette224/ (and coco128/ unless --coco is given)")
    p.add_argument("--coco", help="COCO folder of the coco128 part (default DATA/coco128; '' skips it)")
    p.add_argument("--runs", default=str(ROOT / "runs" / "det"))
    p.add_argument("--results", default=str(ROOT / "results"))
    p.add_argument("--model", default="ssd_tiny_split")
    p.add_argument("--dense-epochs", type=int, default=30, help="125 steps each at batch 32")
    p.add_argument("--epochs", type=int, default=10, help="fine-tuning epochs of every DISCO run")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3, help="dense AdamW learning rate (cosine to 0)")
    p.add_argument("--ft-lr", type=float, default=1e-3, help="DISCO fine-tuning AdamW learning rate")
    p.add_argument("--distill", type=float, default=0.5, help="weight of distillation from the dense model")
    p.add_argument("--coco-model", default="ssd_tiny_split", help="model of the coco128 runs (320x320 input)")
    p.add_argument("--coco-dense-epochs", type=int, default=80, help="8 steps each at batch 16")
    p.add_argument("--coco-epochs", type=int, default=40)
    p.add_argument("--coco-batch-size", type=int, default=16)
    p.add_argument("--limit", type=int, help="images per split (smoke runs)")
    p.add_argument("--threads", type=int, default=2, help="threads of the dense runs")
    p.add_argument("--workers", type=int, default=2, help="DISCO runs in parallel (one thread each)")
    p.add_argument("--only", nargs="*", help="run only these DISCO names (e.g. n2_r0.1)")
    p.add_argument("--name", default="det_ssd",
                   help="results/NAME.json and its picture (another --model: another name and --runs)")
    args = p.parse_args()
    runs, results = Path(args.runs), Path(args.results)
    runs.mkdir(parents=True, exist_ok=True)
    results.mkdir(parents=True, exist_ok=True)
    lim = ["--limit", str(args.limit)] if args.limit else []
    coco = str(Path(args.data) / "coco128") if args.coco is None else args.coco
    shape = "1,3,128,128"

    def dense_run(task: str, data: str, model: str, epochs: int, bs: int, out: Path) -> dict:
        if not out.is_file():
            disco("train", "--task", task, "--data", data, "--model", model, "--epochs", str(epochs),
                  "--batch-size", str(bs), "--lr", str(args.lr), *lim, "--out", str(out), threads=args.threads)
        return cached(out.with_suffix(".json"), lambda: disco("eval", str(out), "--data", data, "--json", *lim,
                                                              threads=args.threads), source=out)

    def one(task: str, data: str, dense: Path, spec: tuple, epochs: int, bs: int) -> dict:
        flags = ["--batch-size", str(bs), "--lr", str(args.ft_lr), "--distill", str(args.distill), *lim]
        return sparsify_run(runs, dense, data, *spec[:3], epochs_of(spec, epochs), flags, task=task, **options_of(spec))

    dense = runs / "dense.safetensors"
    dense_eval = dense_run("det_generated", args.data, args.model, args.dense_epochs, args.batch_size, dense)
    dense_cost = cached(runs / "dense_cost.json", lambda: disco(
        "cost", args.model, "--nodes", "2", "--input-shape", shape, "--json", threads=None))
    rows = WIDE_RUNS if args.model == "ssd_small_split" else RUNS
    todo = [r for r in rows if not args.only or r[0] in args.only]
    with ThreadPoolExecutor(args.workers) as pool:
        list(pool.map(lambda s: one("det_generated", args.data, dense, s, args.epochs, args.batch_size), todo))
    # the JSON holds every finished run, also those of earlier invocations (``--only`` adds to it)
    done = [json.loads((runs / f"{r[0]}.json").read_text()) for r in rows if (runs / f"{r[0]}.json").is_file()]

    entries = [_dense_entry("dense", args.model, "generated", dense_eval, dense_cost, shape, args.dense_epochs)]
    entries += [_entry(r, args.model, "generated", shape, args.distill) for r in done]

    if coco:
        cdense = runs / "coco128_dense.safetensors"
        cshape = "1,3,320,320"
        ceval = dense_run("det_coco128", coco, args.coco_model, args.coco_dense_epochs, args.coco_batch_size, cdense)
        ccost = cached(runs / "coco128_dense_cost.json", lambda: disco(
            "cost", args.coco_model, "--nodes", "2", "--input-shape", cshape, "--json", threads=None))
        entries.append(_dense_entry("coco128_dense", args.coco_model, "coco128", ceval, ccost, cshape,
                                    args.coco_dense_epochs))
        for s in COCO_RUNS:
            r = one("det_coco128", coco, cdense, s, args.coco_epochs, args.coco_batch_size)
            entries.append(_entry(r, args.coco_model, "coco128", cshape, args.distill))
    out = results / f"{args.name}.json"
    out.write_text(json.dumps(entries, indent=1) + "\n")
    print(f"wrote {out}")

    if all((runs / f"{n}.safetensors").is_file() for n in ("n2_r0.1", "n2_r0")):
        from picture import make_picture

        pic = make_picture(runs, args.data, results / f"{args.name}_test.png")
        print(f"wrote {pic}")


def _shape(s: str) -> list[int]:
    return [int(v) for v in s.split(",")]


def _dense_entry(name: str, model: str, dataset: str, ev: dict, cost: dict, shape: str, epochs: int) -> dict:
    return {
        "name": name, "model": model, "dataset": dataset, "eval_on_train": dataset == "coco128", "nodes": 1,
        "ratio": 1.0, "budget": None, "selection": "dense", **{k: ev[k] for k in METRICS if k in ev},
        "bytes": 0, "dense_bytes_n2": cost["dense_bytes"], "flops_total": cost["flops_dense"],
        "params_per_node": [cost["params_dense"]], "input_shape": _shape(shape), "epochs": epochs,
        "checkpoint": None,
    }


def _entry(r: dict, model: str, dataset: str, shape: str, distill: float) -> dict:
    return {
        "name": r["name"], "model": model, "dataset": dataset, "eval_on_train": dataset == "coco128",
        "nodes": r["nodes"], "ratio": r["ratio"], "target_ratio": r["target_ratio"], "budget": r["budget"],
        "selection": r["selection"], **{k: r[k] for k in METRICS if k in r}, "bytes": r["bytes"],
        "dense_bytes": r["dense_bytes"], "stats_bytes": r.get("stats_bytes", 0), "flops_total": r["flops_total"],
        "flops_dense": r["flops_dense"], "params_per_node": r["params_per_node"], "params_dense": r["params_dense"],
        "input_shape": _shape(shape), "epochs": r.get("epochs"), "lr": r.get("lr"), "distill": distill,
        "checkpoint": None,
    }


if __name__ == "__main__":
    main()
