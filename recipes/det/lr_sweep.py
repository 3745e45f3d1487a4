"""Why the detection recipe fine-tunes at lr 1e-3: N=2 runs at r = 1 and r = 0.1 over learning rates.

Each row is the recipe's ``disco sparsify`` command (10 epochs, batch 32, global budget) with only
the ratio, the link scores, the learning rate or the distillation weight changed, from the dense
model that ``det/run.py`` trained (runs/det/dense.safetensors). Resumable; results to
results/det_ssd_lr.json, the table of docs/results-det.md by ``python recipes/tables.py``.

    python recipes/det/lr_sweep.py --data ../shared/data      # after det/run.py; ~7 min per row on one core
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipes"))
from common import sparsify_run  # noqa: E402

# (name, ratio, selection, lr, distill)
ROWS = [
    ("r1_lr5e-4", 1.0, "magnitude", 5e-4, 0.5),
    ("r1_lr5e-4_nodistill", 1.0, "magnitude", 5e-4, 0.0),
    ("r1_lr1e-4", 1.0, "magnitude", 1e-4, 0.5),
    ("r0.1_taylor_lr1e-4", 0.1, "taylor", 1e-4, 0.5),
    ("r0.1_taylor_lr2e-4", 0.1, "taylor", 2e-4, 0.5),
    ("r0.1_taylor_lr1e-3", 0.1, "taylor", 1e-3, 0.5),
    ("r0.1_taylor_lr2e-3", 0.1, "taylor", 2e-3, 0.5),  # is 1e-3 the top of the curve?
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
    lim = ["--limit", str(args.limit)] if args.limit else []

    def one(row: tuple) -> dict:
        name, ratio, selection, lr, distill = row
        flags = ["--batch-size", "32", "--distill", str(distill), *lim]
        r = sparsify_run(runs, Path(args.dense), args.data, name, 2, ratio, args.epochs, flags, selection=selection,
                         lr=lr, task="det_generated")
        return {"name": name, "nodes": 2, "ratio": r["ratio"], "selection": selection, "lr": lr, "distill": distill,
                "epochs": args.epochs, "map": r["map"], "map50": r["map50"]}

    with ThreadPoolExecutor(args.workers) as pool:
        entries = list(pool.map(one, ROWS))
    dense = json.loads((Path(args.dense).with_suffix(".json")).read_text())
    entries.insert(0, {"name": "dense", "nodes": 1, "ratio": 1.0, "map": dense["map"], "map50": dense["map50"]})
    out = Path(args.results) / "det_ssd_lr.json"
    out.write_text(json.dumps(entries, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
