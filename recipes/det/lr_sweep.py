"""Why the detection recipe fine-tunes at lr 1e-3: N=2 runs at r = 1 and r = 0.1 over learning rates.

Each row is the recipe's ``disco sparsify`` command (10 epochs, batch 32, global budget) with only
the ratio, the link scores, the learning rate or the distillation weight changed, from the dense
model that ``det/run.py`` trained (runs/det/dense.safetensors). Resumable; results to
results/det_ssd_lr.json, the table of docs/results-det.md by ``python -m recipes.pages``.

    python recipes/det/lr_sweep.py --data ../shared/data      # after det/run.py; ~7 min per row on one core
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipes"))
from common import Recipe, Run, sparsify_runs  # noqa: E402

ROWS = [
    Run("r1_lr5e-4", 2, 1.0, lr=5e-4, distill=0.5),
    Run("r1_lr5e-4_nodistill", 2, 1.0, lr=5e-4, distill=0.0),
    Run("r1_lr1e-4", 2, 1.0, lr=1e-4, distill=0.5),
    Run("r0.1_taylor_lr1e-4", 2, 0.1, selection="taylor", lr=1e-4, distill=0.5),
    Run("r0.1_taylor_lr2e-4", 2, 0.1, selection="taylor", lr=2e-4, distill=0.5),
    Run("r0.1_taylor_lr1e-3", 2, 0.1, selection="taylor", lr=1e-3, distill=0.5),
    Run("r0.1_taylor_lr2e-3", 2, 0.1, selection="taylor", lr=2e-3, distill=0.5),  # is 1e-3 the top of the curve?
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--dense", default=str(ROOT / "runs" / "det" / "dense.safetensors"))
    p.add_argument("--runs", default=str(ROOT / "runs" / "det" / "lr"))
    p.add_argument("--results", default=str(ROOT / "results"))
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--workers", type=int, default=2, help="runs in parallel (one thread each)")
    p.add_argument("--limit", type=int, help="images per split (smoke runs)")
    args = p.parse_args()
    runs = Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    recipe = Recipe(task="det_generated", model="ssd_tiny_split", input_shape=(1, 3, 128, 128), runs=ROWS,
                    metrics=dict, dense_epochs=0, epochs=args.epochs, distill=0.5, finetune={"batch_size": 32},
                    limit=args.limit)
    done = {r["name"]: r for r in sparsify_runs(recipe, runs, Path(args.dense), args.data, ROWS, args.workers)}
    entries = [{"name": r.name, "nodes": 2, "ratio": done[r.name]["ratio"], "selection": r.selection, "lr": r.lr,
                "distill": r.distill, "epochs": args.epochs, "map": done[r.name]["map"], "map50": done[r.name]["map50"]}
               for r in ROWS]
    dense = json.loads((Path(args.dense).with_suffix(".json")).read_text())
    entries.insert(0, {"name": "dense", "nodes": 1, "ratio": 1.0, "map": dense["map"], "map50": dense["map50"]})
    out = Path(args.results) / "det_ssd_lr.json"
    out.write_text(json.dumps(entries, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
