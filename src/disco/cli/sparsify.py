"""``disco sparsify`` and ``disco eval``: fine-tune a dense checkpoint into a DISCO model; a checkpoint's metric."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..validate import fraction_arg, nodes_arg, nonnegative_float, positive_float, positive_int, ratio_arg, shares_arg
from .parser import OPTIMIZERS, add_threads


def cmd_sparsify(args: argparse.Namespace) -> int:
    from ..sparsify.run import SparsifyConfig, sparsify

    cfg = SparsifyConfig(nodes=args.nodes, shares=args.shares, ratio=args.ratio, budget=args.budget,
                         selection=args.selection, **budget_options(args),
                         epochs=args.epochs, prune_fraction=args.prune_fraction, lr=args.lr, lasso=args.lasso,
                         lasso_weight=args.lasso_weight, distill=args.distill, limit=args.limit,
                         train_subset=args.train_subset, seed=args.seed,
                         batch_size=args.batch_size, train_images=args.train_images, val_split=args.val_split,
                         optimizer=args.optimizer, weight_decay=args.wd, device=args.device, amp=args.amp,
                         workers=args.workers)
    from .. import distributed as D
    from ..loading import load
    from ..validate import check_data_folder, check_nodes_fit, prepare_output

    dense = load(args.checkpoint)  # a missing or damaged checkpoint is refused before any data is read
    check_nodes_fit(dense.model, args.nodes, dense.ckpt.model["name"])
    check_data_folder(args.data)
    res = sparsify(args.checkpoint, args.data, prepare_output(args.out), cfg)
    if D.is_main():
        print(json.dumps(res | {"checkpoint": args.out}))
    return 0



def budget_options(args: argparse.Namespace) -> dict:
    """The joint budget's caps from the command line (the defaults are the paper's profile)."""
    return {"max_flops": args.max_flops, "max_weights_per_node": args.max_weights_per_node,
            "latency_weight": args.latency_weight / getattr(args, "bytes_per_value", 4)}



def add_budget(p: argparse.ArgumentParser) -> None:
    """``--budget`` and the joint budget's caps (cost, sparsify)."""
    from ..sparsify.select import BUDGETS, DEFAULT_MAX_FLOPS, DEFAULT_MAX_WEIGHTS_PER_NODE

    p.add_argument("--budget", default="global", choices=BUDGETS,
                   help="global: score per byte over all layers; layer: r in every layer; joint: bytes plus caps on "
                        "FLOPs and weights per node")
    p.add_argument("--max-flops", type=fraction_arg, default=DEFAULT_MAX_FLOPS,
                   help="joint budget: total FLOPs at most this fraction of dense")
    p.add_argument("--max-weights-per-node", type=fraction_arg, default=DEFAULT_MAX_WEIGHTS_PER_NODE,
                   help="joint budget: every node's weights at most this fraction of the whole model's")
    p.add_argument("--latency-weight", type=nonnegative_float, default=0.0,
                   help="global budget: charge every message (exchange) kept this many bytes when ranking links, "
                        "e.g. latency x bandwidth (125000 for 20 ms at 50 Mbit/s): fewer, fuller messages")



def cmd_eval(args: argparse.Namespace) -> int:
    from .. import distributed as D
    from ..api import evaluate

    out = evaluate(args.checkpoint, args.data, batch_size=args.batch_size, limit=args.limit, device=args.device,
                   amp=args.amp, workers=args.workers)
    if not D.is_main():
        return 0
    if args.json:
        print(json.dumps(out))
    else:
        print("  ".join(f"{k}={v}" for k, v in out.items()))
    return 0



def add_commands(sub: Any) -> None:
    """Register ``sparsify`` and ``eval``."""
    from ..distributed import add_device_args

    s = sub.add_parser("sparsify", help="fine-tune a dense checkpoint into a DISCO model at ratio r")
    s.add_argument("checkpoint", help="dense checkpoint (from disco train)")
    s.add_argument("--data", required=True)
    s.add_argument("--nodes", type=nodes_arg, default=2, help="N >= 2")
    s.add_argument("--shares", type=shares_arg, help="node shares of every layer's channels, e.g. 2,1 (default equal)")
    s.add_argument("--ratio", type=ratio_arg, required=True,
                   help="target communication ratio in [0, 1] (0 = separated)")
    add_budget(s)
    s.add_argument("--selection", default="lasso", choices=("lasso", "magnitude", "taylor", "random"),
                   help="how links are ranked; lasso: a byte-weighted group-lasso penalty first (see --lasso)")
    s.add_argument("--lasso", type=nonnegative_float, default=2.0,
                   help="final group-lasso strength of --selection lasso")
    s.add_argument("--lasso-weight", default="bytes", choices=("bytes", "joint"),
                   help="what each link's lasso group is charged: its bytes (default), or with --budget joint its "
                        "share of the byte, FLOPs and weight rooms (the lasso then acts on the capped quantities)")
    s.add_argument("--epochs", type=positive_int, default=10)
    s.add_argument("--prune-fraction", type=fraction_arg, default=0.5, help="share of the run spent lowering r")
    s.add_argument("--lr", type=positive_float,
                   help="fine-tuning learning rate (default: the task's; 0.02 for cifar10)")
    s.add_argument("--distill", type=fraction_arg, default=0.0,
                   help="weight in [0, 1] of distillation from the dense model")
    s.add_argument("--optimizer", choices=OPTIMIZERS, help="default: the task's")
    s.add_argument("--wd", type=nonnegative_float, help="weight decay (default: the task's)")
    s.add_argument("--batch-size", type=positive_int, default=128)
    s.add_argument("--limit", type=positive_int, help="use only the first LIMIT images of each split (smoke runs)")
    s.add_argument("--train-subset", type=positive_int,
                   help="fine-tune on this many training images (a fixed subset per seed)")
    s.add_argument("--train-images", type=positive_int,
                   help="the run's length as images seen instead of --epochs (the last epoch may end early)")
    s.add_argument("--val-split", type=int, default=0,
                   help="carve this many training images out as a validation split (val_ metrics; the same "
                        "images for every seed), for tuning without the test set (default: 0)")
    s.add_argument("--seed", type=int, default=0,
                   help="seeds everything random: data order, augmentation, subset, random links")
    add_threads(s)
    add_device_args(s)
    s.add_argument("--out", required=True, help="DISCO checkpoint to write (.safetensors); resumes if interrupted")
    s.set_defaults(func=cmd_sparsify)

    e = sub.add_parser("eval", help="evaluate a checkpoint on its task's test split")
    e.add_argument("checkpoint")
    e.add_argument("--data", required=True)
    e.add_argument("--batch-size", type=positive_int, default=500)
    e.add_argument("--limit", type=positive_int, help="evaluate only the first LIMIT test images")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    add_threads(e)
    add_device_args(e)
    e.set_defaults(func=cmd_eval)

