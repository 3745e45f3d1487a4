"""The ``disco`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys

import torch

log = logging.getLogger("disco")


def _threads(args: argparse.Namespace) -> None:
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)


def cmd_train(args: argparse.Namespace) -> int:
    from .api import train

    res = train(args.task, args.data, args.out, model=args.model, weights=args.weights, epochs=args.epochs,
                lr=args.lr, weight_decay=args.wd, optimizer=args.optimizer, batch_size=args.batch_size,
                limit=args.limit, seed=args.seed, eval_every=args.eval_every)
    print(json.dumps(res))
    return 0


OPTIMIZERS = ("sgd", "adam", "adamw")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="disco", description="Distributed DNN inference with sparse communications.")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="train a dense model (the starting point of DISCO)")
    t.add_argument("--task", default="cifar10")
    t.add_argument("--model", help="registered or torchvision model name (default: the task's)")
    t.add_argument("--weights", help="local state-dict file to start from")
    t.add_argument("--data", required=True, help="dataset folder")
    t.add_argument("--epochs", type=int, default=30)
    t.add_argument("--lr", type=float, help="learning rate (default: the task's; 0.1 for cifar10)")
    t.add_argument("--wd", type=float, help="weight decay (default: the task's; 5e-4 for cifar10)")
    t.add_argument("--optimizer", choices=OPTIMIZERS, help="default: the task's (sgd for cifar10, adam for sr)")
    t.add_argument("--batch-size", type=int, default=128)
    t.add_argument("--limit", type=int, help="use only the first LIMIT images of each split (smoke runs)")
    t.add_argument("--eval-every", action="store_true", help="evaluate after every epoch")
    t.add_argument("--seed", type=int, default=0, help="seeds init, data order and augmentation")
    t.add_argument("--threads", type=int)
    t.add_argument("--out", required=True, help="checkpoint to write (.safetensors); resumes if interrupted")
    t.set_defaults(func=cmd_train)

    from .commands import add_core_commands

    add_core_commands(sub)
    from .runtime.cli import add_subcommands
    add_subcommands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    _threads(args)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, KeyError) as e:
        log.debug("error", exc_info=True)
        print(f"disco: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("disco: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
