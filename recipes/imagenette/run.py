"""Imagenette (real ImageNet photos, 10 classes) with a torchvision ResNet-18: dense, then DISCO.

A small-data proxy for the paper's ImageNet ResNet-50 result: the shared imagenette224 copy has
1000 training and 500 validation images; the model is trained from random weights at a reduced
image size on CPUs. Every step is resumable; a finished run is skipped. The JSON goes to
results/imagenette_resnet.json (no checkpoint is committed: ResNet-18 weights are 45 MB).

    python recipes/imagenette/run.py --data ../shared/data/imagenette224 --workers 1
    python -m recipes.pages
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipes"))
from common import Recipe, Run, add_args, drive, with_args, write_results  # noqa: E402

RUNS = [Run("n2_r0.2", 2, 0.2), Run("n2_r0.1", 2, 0.1), Run("n2_r0", 2, 0.0), Run("n4_r0.2", 4, 0.2)]
IMAGE_SIZE = 64
ON_CPU = {"batch_size": 64, "workers": 0, "device": "cpu"}  # images decoded in the main process, one core


def top1_top5(res: dict) -> dict:
    return {"top1": res["top1"], "top5": res["top5"]}


RECIPE = Recipe(
    task="imagefolder", model="resnet18", input_shape=(1, 3, IMAGE_SIZE, IMAGE_SIZE), runs=RUNS, metrics=top1_top5,
    dense_epochs=18, epochs=5, distill=0.5, train={"image_size": IMAGE_SIZE, **ON_CPU}, finetune=dict(ON_CPU),
    extra={"image_size": IMAGE_SIZE},
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "imagenette224"))
    add_args(p, runs=None, dense_epochs=RECIPE.dense_epochs, epochs=RECIPE.epochs)
    args = p.parse_args()
    official = args.runs is None
    runs = Path(args.runs or ROOT / "runs" / "imagenette")
    entries = drive(with_args(RECIPE, args), args.data, runs, args)
    done = [e for e in entries if e["nodes"] > 1]
    if done:  # the dense entry's cost of the 10-class model (common.dense_model costs the 1000-class default)
        d = entries[0]
        d.update(dense_bytes_n2=done[0]["dense_bytes"], flops_total=done[0]["flops_dense"],
                 params_per_node=[done[0]["params_dense"]])
    write_results(entries, (Path(args.results) if official else runs) / "imagenette_resnet.json")


if __name__ == "__main__":
    main()
