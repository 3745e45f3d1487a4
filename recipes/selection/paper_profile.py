"""The paper's profile, counted (issue 32 item 4): `disco cost --json` of the long protocol's joint-budget
checkpoints (CIFAR ResNet-20, N=2 r=0.2, 250k images seen, each seed) beside ResNet-50's at the same setting
(a model name: counted only, no accuracy), written to results/paper_profile.json.

    python recipes/selection/paper_profile.py        # needs runs/selection_long/ from recipes/selection/long.py
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LONG_RUNS = ROOT / "runs" / "selection_long"
SOURCES = ([(f"n2_r0.2_joint_lasso_i250k_s{s}", ["--nodes", "2"]) for s in range(3)]
           + [(f"n2_r0.2_joint_lassojoint_i250k_s{s}", ["--nodes", "2"]) for s in range(3)])
RESNET50 = ["resnet50", "--nodes", "2", "--ratio", "0.2", "--budget", "joint"]


def cost(args: list[str]) -> dict:
    """``disco cost ARGS --json``: the command a reader runs."""
    out = subprocess.run([sys.executable, "-m", "disco.cli", "cost", *args, "--json"], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout)


def entry(name: str, rep: dict, top1: float | None) -> dict:
    model = Path(rep["model"])
    model = str(model.relative_to(ROOT)) if model.is_absolute() and model.is_relative_to(ROOT) else rep["model"]
    return {"name": name, "model": model, "nodes": rep["nodes"], "ratio": rep["ratio"],
            "traffic_reduction": rep["dense_bytes"] / rep["bytes"],
            "flops_share": rep["flops_total"] / rep["flops_dense"],
            "weights_per_node_share": max(rep["params_per_node"]) / rep["params_dense"], "top1": top1}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default=str(LONG_RUNS))
    p.add_argument("--out", default=str(ROOT / "results" / "paper_profile.json"))
    a = p.parse_args()
    rows = []
    for name, _ in SOURCES:
        ckpt, res = Path(a.runs) / f"{name}.safetensors", Path(a.runs) / f"{name}.json"
        if not (ckpt.is_file() and res.is_file()):
            print(f"skip {name}: not run yet", flush=True)
            continue
        rows.append(entry(name, cost([str(ckpt)]), json.loads(res.read_text())["top1"]))
    rows.append(entry("resnet50", cost(RESNET50), None))
    Path(a.out).write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wrote {a.out}: {len(rows)} entries", flush=True)


if __name__ == "__main__":
    main()
