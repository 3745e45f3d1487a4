"""Which links to keep: random, magnitude, taylor and group-lasso selection on CIFAR ResNet-20, several seeds.

Every run starts from the committed dense checkpoint (src/disco/assets/cifar_resnet20_dense.safetensors) and
fine-tunes with the same schedule; only ``--selection`` and ``--seed`` change within a setting. Finished runs are
skipped (each keeps ``runs/selection/NAME.json``), and results/cifar10_selection.json is rewritten after every run.

    OMP_NUM_THREADS=1 nice -n 10 python recipes/selection/run.py --data ../shared/data/cifar10
    python -m recipes.pages   # docs/selection.md and results/cifar10_selection.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipes"))
from common import sparsify_cached  # noqa: E402

DENSE = ROOT / "src" / "disco" / "assets" / "cifar_resnet20_dense.safetensors"
SETTINGS = [(4, 0.1), (2, 0.1), (4, 0.05), (2, 0.05)]  # (nodes, ratio), the target setting first
SELECTIONS = ["random", "magnitude", "taylor", "lasso"]
FIELDS = ("selection", "budget", "latency_weight", "nodes", "ratio", "target_ratio", "seed", "top1", "epochs",
          "train_subset", "distill", "messages_per_inference", "bytes", "dense_bytes", "flops_total", "flops_dense",
          "params_per_node", "params_dense", "name")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--settings", default=",".join(f"{n}:{r}" for n, r in SETTINGS), help="N:r,N:r,...")
    p.add_argument("--selections", default=",".join(SELECTIONS))
    p.add_argument("--budget", default="global")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--train-subset", type=int, default=2500, help="0: the whole training set")
    p.add_argument("--distill", type=float, default=0.5)
    p.add_argument("--latency-weight", type=float, default=0.0,
                   help="global budget: bytes charged per message kept (disco sparsify --latency-weight)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", default=str(ROOT / "runs" / "selection"))
    p.add_argument("--result", default=str(ROOT / "results" / "cifar10_selection.json"))
    a = p.parse_args()
    runs = Path(a.runs)
    runs.mkdir(parents=True, exist_ok=True)
    settings = [(int(n), float(r)) for n, r in (s.split(":") for s in a.settings.split(","))]
    subset = a.train_subset or None
    for nodes, ratio in settings:
        for seed in (int(s) for s in a.seeds.split(",")):
            for sel in a.selections.split(","):
                lw = f"_lw{a.latency_weight:g}" if a.latency_weight else ""
                name = f"n{nodes}_r{ratio}_{a.budget}{lw}_{sel}_e{a.epochs}_sub{subset or 'all'}_s{seed}"
                recover(runs, name, epochs=a.epochs, seed=seed, train_subset=subset, distill=a.distill)
                config = {"nodes": nodes, "ratio": ratio, "epochs": a.epochs, "budget": a.budget, "selection": sel,
                          "seed": seed, "train_subset": subset, "distill": a.distill}
                if a.latency_weight:
                    config["latency_weight"] = a.latency_weight
                sparsify_cached(runs, DENSE, a.data, name, config, a.threads, seed=seed, train_subset=subset,
                                distill=a.distill, latency_weight=a.latency_weight)
                collect(runs, Path(a.result))


def recover(runs: Path, name: str, **fields: object) -> None:
    """A run whose driver stopped after ``disco sparsify`` wrote its checkpoint: its result from the checkpoint."""
    out, res_file = runs / f"{name}.safetensors", runs / f"{name}.json"
    if not out.is_file() or res_file.is_file():
        return
    from disco.cost import estimate
    from disco.loading import load

    loaded = load(out)
    rep = estimate(loaded.partition, loaded.model.kept)
    cfg = loaded.ckpt.info["config"]
    res = {"nodes": rep.nodes, "ratio": rep.ratio, "target_ratio": cfg["ratio"], "budget": cfg["budget"],
           "selection": cfg["selection"], **loaded.ckpt.info["metrics"], "bytes": rep.bytes,
           "dense_bytes": rep.dense_bytes, "flops_total": rep.flops_total, "flops_dense": rep.flops_dense,
           "params_per_node": rep.params_per_node, "params_dense": rep.params_dense, "name": name, **fields}
    res_file.write_text(json.dumps(res))


def collect(runs: Path, result: Path) -> None:
    """Every finished run of ``runs`` (all budgets and sizes) into ``result``, sorted, with the fields above."""
    entries = []
    for f in sorted(runs.glob("*.json")):
        e = json.loads(f.read_text())
        ckpt = f.with_suffix(".safetensors")
        if "messages_per_inference" not in e and ckpt.is_file():  # runs from before the field: from the checkpoint
            from disco.cost import estimate
            from disco.loading import load

            loaded = load(ckpt)
            e["messages_per_inference"] = estimate(loaded.partition, loaded.model.kept).messages_per_inference
            f.write_text(json.dumps(e))
        entries.append(e)
    rows = [{k: e.get(k) for k in FIELDS} for e in entries]
    rows.sort(key=lambda e: (e["budget"], -e["nodes"], -e["target_ratio"], e["selection"], e["seed"]))
    result.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
