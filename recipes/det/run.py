"""Object detection with a split SSD: dense, then DISCO at N=2 and N=4, on the generated set and coco128.

Every step is resumable (each run checkpoints per epoch; a finished run is skipped). Results go to
results/det_ssd.json (``map`` = COCO mAP@[.5:.95], ``map50`` = mAP@.5, in percent), the picture of
detections to results/det_ssd_test.png (the plot of mAP against r, results/det_ssd.png, is recipes/pages').

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
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipes"))
from common import Recipe, Run, add_args, drive, ratio_sweep, with_args, write_results  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

# the global byte budget and magnitude selection unless a row says otherwise; r = 0: separated branches
RUNS = [
    *ratio_sweep(),
    # Taylor scores (first-order loss change per byte) instead of weight magnitude per byte
    Run("n2_r0.1_taylor", 2, 0.1, selection="taylor"),
    Run("n4_r0.1_taylor", 4, 0.1, selection="taylor"),
]
# the rows of --model ssd_small_split (twice the width): what the r = 0.1 success check needs
WIDE_RUNS = [
    Run("n2_r1", 2, 1.0),
    Run("n2_r0.1_taylor", 2, 0.1, selection="taylor"),
    Run("n2_r0", 2, 0.0),
    # 3x the fine-tuning, and separated branches fine-tuned as long (the fair comparison for it)
    Run("n2_r0.1_taylor_ft30", 2, 0.1, epochs=30, selection="taylor"),
    Run("n2_r0_ft30", 2, 0.0, epochs=30),
    Run("n2_r0.1_taylor_lr2e-3", 2, 0.1, selection="taylor", lr=2e-3),  # lr_sweep.py: 2e-3 beat 1e-3
    Run("n2_r0_lr2e-3", 2, 0.0, lr=2e-3),  # separated branches at that rate: the fair comparison for it
]
COCO_RUNS = [Run("coco128_n2_r0.1", 2, 0.1)]
METRICS = ("map", "map50", "post_ms", "model_ms", "n")


def metrics_of(res: dict) -> dict:
    return {k: res[k] for k in METRICS if k in res}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"),
                   help="folder holding cifar10/ and imagenette224/ (and coco128/ unless --coco is given)")
    p.add_argument("--coco", help="COCO folder of the coco128 part (default DATA/coco128; '' skips it)")
    p.add_argument("--model", default="ssd_tiny_split")
    add_args(p, runs=ROOT / "runs" / "det", dense_epochs=30, epochs=10, dense_threads_default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3, help="dense AdamW learning rate (cosine to 0)")
    p.add_argument("--ft-lr", type=float, default=1e-3, help="DISCO fine-tuning AdamW learning rate")
    p.add_argument("--coco-model", default="ssd_tiny_split", help="model of the coco128 runs (320x320 input)")
    p.add_argument("--coco-dense-epochs", type=int, default=80, help="8 steps each at batch 16")
    p.add_argument("--coco-epochs", type=int, default=40)
    p.add_argument("--coco-batch-size", type=int, default=16)
    p.add_argument("--name", default="det_ssd",
                   help="results/NAME.json and its picture (another --model: another name and --runs)")
    return p


def recipes_of(args: argparse.Namespace) -> list[tuple[Recipe, str]]:
    """The generated-set recipe and, unless ``--coco ''``, the coco128 one, each with its data folder."""
    coco = str(Path(args.data) / "coco128") if args.coco is None else args.coco
    generated = with_args(Recipe(
        task="det_generated", model=args.model, input_shape=(1, 3, 128, 128), metrics=metrics_of,
        runs=WIDE_RUNS if args.model == "ssd_small_split" else RUNS, dense_epochs=30, epochs=10, distill=0.5,
        train={"batch_size": args.batch_size, "lr": args.lr},
        finetune={"batch_size": args.batch_size, "lr": args.ft_lr},
        extra={"dataset": "generated", "eval_on_train": False}), args)
    out = [(generated, args.data)]
    if coco:  # real COCO images, trained and evaluated on the same 128 (the customary use of that set)
        out.append((replace(generated, task="det_coco128", model=args.coco_model, input_shape=(1, 3, 320, 320),
                          runs=COCO_RUNS, dense_epochs=args.coco_dense_epochs, epochs=args.coco_epochs,
                          dense_name="coco128_dense", extra={"dataset": "coco128", "eval_on_train": True},
                          train={**generated.train, "batch_size": args.coco_batch_size},
                          finetune={**generated.finetune, "batch_size": args.coco_batch_size}), coco))
    return out


def main() -> None:
    args = build_parser().parse_args()
    runs, results = Path(args.runs), Path(args.results)
    (generated, data), *coco = recipes_of(args)
    entries = drive(generated, data, runs, args)
    for recipe, data in coco:  # --only names rows of the generated set: the coco128 rows always run
        entries += drive(recipe, data, runs, argparse.Namespace(**{**vars(args), "only": None}))
    write_results(entries, results / f"{args.name}.json")

    if all((runs / f"{n}.safetensors").is_file() for n in ("n2_r0.1", "n2_r0")):
        from picture import make_picture

        pic = make_picture(runs, args.data, results / f"{args.name}_test.png")
        print(f"wrote {pic}")


if __name__ == "__main__":
    main()
