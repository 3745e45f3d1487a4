"""CIFAR-10 ResNet-20 at proper length on a GPU: dense to the customary accuracy, then DISCO N=2 at r=0.2 and 0.1.

Prepared for a machine with a CUDA GPU (tried on the CPU with tiny settings only, see below). Every step is
resumable; a finished run is skipped. Writes results/cifar10_resnet_gpu.json with the hardware named in every
entry (``hardware``), beside the CPU results of results/cifar10_resnet.json.

    python recipes/cifar10/gpu.py --data ../shared/data/cifar10 --amp bf16          # 200 + 2 x 30 epochs
    python recipes/cifar10/gpu.py --data ../shared/data/cifar10 --device cpu --dense-epochs 1 --epochs 1 \\
        --limit 512 --runs /tmp/gpu_smoke                                            # the CPU smoke test
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipes"))
from common import Recipe, Run, add_args, drive, with_args, write_results  # noqa: E402


def hardware(device: str) -> str:
    import torch

    if device != "cpu" and torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return f"CPU ({platform.processor() or platform.machine()})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "cifar10"))
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--amp", choices=("bf16", "fp16"), help="autocast (CUDA only; default fp32)")
    # SGD, Nesterov, lr 0.1, batch 128, weight decay 5e-4, cosine (the task's defaults); ~91-92 % expected
    add_args(p, runs=None, dense_epochs=200, epochs=30, dense_threads_default=0)
    args = p.parse_args()
    dev = {"device": args.device, "amp": args.amp}
    recipe = with_args(Recipe(
        task="cifar10", model="cifar_resnet20", input_shape=(1, 3, 32, 32),
        runs=[Run("n2_r0.2", 2, 0.2), Run("n2_r0.1", 2, 0.1)], metrics=lambda r: {"top1": r["top1"]},
        dense_epochs=args.dense_epochs, epochs=args.epochs, distill=args.distill, train=dict(dev),
        finetune=dict(dev), extra={"hardware": hardware(args.device)},
    ), args)
    official = args.runs is None
    runs = Path(args.runs or ROOT / "runs" / "cifar10_gpu")
    entries = drive(recipe, args.data, runs, args)
    write_results(entries, (Path(args.results) if official else runs) / "cifar10_resnet_gpu.json")


if __name__ == "__main__":
    main()
