"""CIFAR-10 ResNet-20 at proper length on a GPU: dense to the customary accuracy, then DISCO N=2 at r=0.2 and 0.1.

Prepared for a machine with a CUDA GPU (tested on the CPU with tiny settings only). Every step is
resumable; a finished run is skipped. Writes results/cifar10_resnet_gpu.json with the GPU's name in
every entry (``hardware``), beside the CPU results of results/cifar10_resnet.json.

    python recipes/cifar10/gpu.py --data ../shared/data/cifar10                  # ~200 + 2 x 30 epochs
    python recipes/cifar10/gpu.py --data ../shared/data/cifar10 --device cpu --dense-epochs 1 --epochs 1 \\
        --limit 512 --runs /tmp/gpu_smoke                                         # the CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipes"))
from common import disco, sparsify_run  # noqa: E402

RUNS = [("n2_r0.2", 2, 0.2), ("n2_r0.1", 2, 0.1)]


def hardware(device: str) -> str:
    import torch

    if device != "cpu" and torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return f"CPU ({platform.processor() or platform.machine()})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "cifar10"))
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--amp", choices=("bf16", "fp16"), help="autocast (CUDA only; default: fp32)")
    p.add_argument("--dense-epochs", type=int, default=200, help="cosine schedule; ~91-92%% top-1 expected")
    p.add_argument("--epochs", type=int, default=30, help="fine-tuning epochs of each DISCO run")
    p.add_argument("--distill", type=float, default=0.5)
    p.add_argument("--limit", type=int, help="smoke runs: the first LIMIT images of each split")
    p.add_argument("--runs", help="run folder (default runs/cifar10_gpu; the JSON goes to results/ unless set)")
    args = p.parse_args()
    runs = Path(args.runs or ROOT / "runs" / "cifar10_gpu")
    runs.mkdir(parents=True, exist_ok=True)
    dev = ["--device", args.device, *(["--amp", args.amp] if args.amp else [])]
    lim = ["--limit", str(args.limit)] if args.limit else []
    dense = runs / "dense.safetensors"
    if not dense.is_file():  # SGD, Nesterov, lr 0.1, batch 128, weight decay 5e-4, cosine (the task's defaults)
        disco("train", "--data", args.data, "--model", "cifar_resnet20", "--epochs", str(args.dense_epochs),
              *dev, *lim, "--out", str(dense), threads=None)
    dense_eval = disco("eval", str(dense), "--data", args.data, *dev, *lim, "--json", threads=None)
    results = [sparsify_run(runs, dense, args.data, name, nodes, ratio, args.epochs,
                            ["--distill", str(args.distill), *dev, *lim], threads=None)
               for name, nodes, ratio in RUNS]
    hw = hardware(args.device)
    entries = [{"name": "dense", "model": "cifar_resnet20", "nodes": 1, "ratio": 1.0, "budget": None,
                "selection": "dense", "top1": dense_eval["top1"], "epochs": args.dense_epochs, "hardware": hw,
                "checkpoint": None}]
    for r in results:
        entries.append({k: r[k] for k in ("name", "nodes", "ratio", "target_ratio", "budget", "selection", "top1",
                                          "bytes", "dense_bytes", "flops_total", "flops_dense", "params_per_node",
                                          "params_dense", "epochs")}
                       | {"model": "cifar_resnet20", "distill": args.distill, "hardware": hw, "checkpoint": None})
    out = (ROOT / "results" if args.runs is None else runs) / "cifar10_resnet_gpu.json"
    out.write_text(json.dumps(entries, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
