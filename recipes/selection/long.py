"""The long protocol: CIFAR ResNet-20 fine-tuned on the whole training set, its length given as images seen.

Every run starts from the committed dense checkpoint (src/disco/assets/cifar_resnet20_dense.safetensors), trains
on the training set less a fixed validation split of 5,000 images (``val_top1``: the split to tune on; ``top1``
is the whole test set, never tuned on), lasso selection unless a row says otherwise, distillation 0.5 from the
dense model, SGD lr 0.02 cosine, r lowered over the first half of the run. The runs are a list in priority
order (the targets' lengths first); finished runs are skipped (``runs/selection_long/NAME.json``), a run
stopped midway resumes from its last finished epoch, and results/cifar10_selection_long.json is rewritten after
every run, so the sweep can span several sessions. Two processes run side by side, one thread each.

    OMP_NUM_THREADS=1 nice -n 5 python recipes/selection/long.py --data ../shared/data/cifar10
    python recipes/selection/long.py --data ../shared/data/cifar10 --only joint   # rows whose name has 'joint'
    python recipes/selection/long.py --data ../shared/data/cifar10 --tune   # the settings screen (validation split)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipes"))
from common import sparsify_cached  # noqa: E402

DENSE = ROOT / "src" / "disco" / "assets" / "cifar_resnet20_dense.safetensors"
VAL_SPLIT = 5000
LENGTHS = (250_000, 100_000, 10_000)  # images seen; the targets' length first
FIELDS = ("name", "budget", "selection", "nodes", "ratio", "target_ratio", "seed", "train_images_seen", "epochs",
          "train_subset", "val_split", "distill", "top1", "val_top1", "flops_total", "flops_dense",
          "params_per_node", "params_dense", "bytes", "dense_bytes", "messages_per_inference",
          "lasso_weight", "latency_weight", "setting")


def rows() -> list[tuple[str, dict]]:
    """(name, SparsifyConfig fields) of every run, in the order they are run."""
    out = []
    for images in LENGTHS:  # N=2 r=0.2: the global and the joint budget, the curves
        for seed in (0, 1, 2):
            for budget in ("joint", "global"):
                out.append((f"n2_r0.2_{budget}_lasso_i{images // 1000}k_s{seed}",
                            {"nodes": 2, "ratio": 0.2, "budget": budget, "selection": "lasso", "seed": seed,
                             "train_images": images}))
        if images == LENGTHS[0]:  # N=4 r=0.1: lasso against random at the longest length
            for seed in (0, 1, 2):
                for sel in ("lasso", "random"):
                    out.append((f"n4_r0.1_global_{sel}_i{images // 1000}k_s{seed}",
                                {"nodes": 4, "ratio": 0.1, "budget": "global", "selection": sel, "seed": seed,
                                 "train_images": images}))
    for seed in (0, 1, 2):  # N=2 separated branches (r=0) at the longest length: the joint target's floor
        out.append((f"n2_r0_separated_i{LENGTHS[0] // 1000}k_s{seed}",
                    {"nodes": 2, "ratio": 0.0, "budget": "global", "selection": "lasso", "seed": seed,
                     "train_images": LENGTHS[0]}))
    for seed in (0, 1, 2):  # N=2 r=0.2 joint, a second way of meeting the caps: the lasso charged the capped rooms
        out.append((f"n2_r0.2_joint_lassojoint_i{LENGTHS[0] // 1000}k_s{seed}",
                    {"nodes": 2, "ratio": 0.2, "budget": "joint", "selection": "lasso", "lasso_weight": "joint",
                     "seed": seed, "train_images": LENGTHS[0]}))
    for seed in (0, 1, 2):  # N=4 r=0.1 with --latency-weight (the README's messages line) at the longest length
        out.append((f"n4_r0.1_global_lasso_lw125k_i{LENGTHS[0] // 1000}k_s{seed}",
                    {"nodes": 4, "ratio": 0.1, "budget": "global", "selection": "lasso", "latency_weight": 125000.0,
                     "seed": seed, "train_images": LENGTHS[0]}))
    for seed in (0, 1, 2):  # N=2 r=0.2 joint with the screen's best setting (pruning over 30% of the run)
        out.append((f"n2_r0.2_joint_lasso_prune0.3_i{LENGTHS[0] // 1000}k_s{seed}",
                    {"nodes": 2, "ratio": 0.2, "budget": "joint", "selection": "lasso", "prune_fraction": 0.3,
                     "setting": "prune0.3", "seed": seed, "train_images": LENGTHS[0]}))
    for seed in (0, 1, 2):  # ... and with the screen's second best too (distillation 0.9)
        out.append((f"n2_r0.2_joint_lasso_prune0.3_distill0.9_i{LENGTHS[0] // 1000}k_s{seed}",
                    {"nodes": 2, "ratio": 0.2, "budget": "joint", "selection": "lasso", "prune_fraction": 0.3,
                     "distill": 0.9, "setting": "prune0.3+distill0.9", "seed": seed, "train_images": LENGTHS[0]}))
    return out


# a screen of the recipe's settings on the validation split (--tune): the joint budget at N=2 r=0.2, 100k images,
# seed 0, one setting changed from the protocol's (lr 0.02, distillation 0.5, lasso 2.0, pruning over half the run)
TUNE = {"lr0.05": {"lr": 0.05}, "lr0.01": {"lr": 0.01}, "distill0.9": {"distill": 0.9},
        "prune0.3": {"prune_fraction": 0.3}, "lasso4": {"lasso": 4.0}}


def tune_rows() -> list[tuple[str, dict]]:
    base = {"nodes": 2, "ratio": 0.2, "budget": "joint", "selection": "lasso", "seed": 0, "train_images": 100_000}
    return [(f"tune_joint_i100k_{name}_s0", {**base, **change, "setting": name}) for name, change in TUNE.items()]


def run_one(runs: Path, data: str, name: str, cfg: dict) -> dict:
    cfg = dict(cfg)
    setting = cfg.pop("setting", "protocol")  # the screen's name for what it changed
    config = {"epochs": 1, "distill": 0.5, "val_split": VAL_SPLIT, **cfg}
    return sparsify_cached(runs, DENSE, data, name, config, 1, seed=cfg["seed"], train_subset=None,
                           distill=config["distill"], val_split=VAL_SPLIT, setting=setting,
                           lasso_weight=cfg.get("lasso_weight", "bytes"), latency_weight=cfg.get("latency_weight", 0.0))


def _run(args: tuple) -> dict:
    return run_one(*args)


def collect(runs: Path, result: Path) -> None:
    """Every finished run of ``runs`` into ``result`` with the fields above, sorted. Entries already in ``result``
    are kept (a fresh machine has no ``runs`` folder; the result file is the record, ``runs`` only its cache)."""
    kept = {e["name"]: e for e in (json.loads(result.read_text()) if result.is_file() else [])}
    for e in (json.loads(f.read_text()) for f in sorted(runs.glob("*.json"))):
        e.setdefault("lasso_weight", "bytes")  # runs from before the options existed: bytes, no message charge
        e.setdefault("latency_weight", 0.0)
        e.setdefault("setting", "protocol")
        kept[e["name"]] = {k: e.get(k) for k in FIELDS}
    out = sorted(kept.values(), key=lambda e: (e["budget"], -e["nodes"], e["selection"], e["lasso_weight"],
                                               e["latency_weight"], e["train_images_seen"] or 0, e["seed"],
                                               e.get("setting") or ""))
    result.write_text(json.dumps(out, indent=1) + "\n")


def done(runs: Path, result: Path) -> set[str]:
    """Names of the finished runs: a result in ``runs`` or an entry in ``result``."""
    names = {f.stem for f in runs.glob("*.json")}
    return names | ({e["name"] for e in json.loads(result.read_text())} if result.is_file() else set())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--only", default="", help="run only the rows whose name contains this")
    p.add_argument("--tune", action="store_true",
                   help="the screen of settings (runs/selection_tune -> results/cifar10_selection_tune.json)")
    p.add_argument("--workers", type=int, default=2, help="runs side by side, one thread each (default: 2)")
    p.add_argument("--runs", help="default: runs/selection_long (--tune: runs/selection_tune)")
    p.add_argument("--result", help="default: results/cifar10_selection_long.json (--tune: ..._tune.json)")
    a = p.parse_args()
    kind = "tune" if a.tune else "long"
    runs = Path(a.runs or ROOT / "runs" / f"selection_{kind}")
    result = Path(a.result or ROOT / "results" / f"cifar10_selection_{kind}.json")
    runs.mkdir(parents=True, exist_ok=True)
    finished = done(runs, result)
    todo = [(n, c) for n, c in (tune_rows() if a.tune else rows()) if a.only in n and n not in finished]
    print(f"{len(todo)} run(s) to do", flush=True)
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that has started torch threads
    pool = ctx.Pool(max(1, a.workers))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `kill` stops the runs too (they resume later)
    try:
        for _ in pool.imap_unordered(_run, [(runs, a.data, n, c) for n, c in todo]):
            collect(runs, result)  # after every run, so that a long sweep's results are there as they come
    finally:
        pool.terminate()  # no orphan keeps training into a run's files after this process ends
        collect(runs, result)


if __name__ == "__main__":
    main()
