"""``disco train``: a dense model, the starting point of DISCO."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..validate import nonnegative_float, nonnegative_int, positive_float, positive_int
from .parser import OPTIMIZERS, add_threads, task_names


def cmd_train(args: argparse.Namespace) -> int:
    from .. import distributed as D
    from ..api import train_checkpoint
    from ..validate import prepare_output

    out = prepare_output(args.out, create=False)
    res = train_checkpoint(args.task, args.data, out, model=args.model, weights=args.weights,
                           epochs=args.epochs, lr=args.lr, weight_decay=args.wd, optimizer=args.optimizer,
                           batch_size=args.batch_size, limit=args.limit, seed=args.seed, eval_every=args.eval_every,
                           num_classes=args.num_classes, image_size=args.image_size, workers=args.workers,
                           cache_dir=args.cache_dir, device=args.device, amp=args.amp)
    if D.is_main():
        print(json.dumps(res))
    return 0


def add_commands(sub: Any) -> None:
    """Register ``train``."""
    from ..distributed import add_device_args

    t = sub.add_parser("train", help="train a dense model (the starting point of DISCO)")
    t.add_argument("--task", default="cifar10", help="task: " + ", ".join(task_names()))
    t.add_argument("--model", help="registered, torchvision or timm model name (default: the task's)")
    t.add_argument("--weights", help="local state-dict file (.pth/.pt or .safetensors) to start from")
    t.add_argument("--num-classes", type=positive_int,
                   help="replace the --weights file's classifier head by a new one with this many classes "
                        "(imagefolder: the class count of --data)")
    t.add_argument("--image-size", type=positive_int, help="imagefolder: training crop and eval size (default 224)")
    t.add_argument("--data", required=True, help="dataset folder (see docs/cli.md for each task's layout)")
    t.add_argument("--epochs", type=nonnegative_int, default=30,
                   help="0: no training, only the checkpoint of --weights (evaluated)")
    t.add_argument("--lr", type=positive_float, help="learning rate (default: the task's; 0.1 for cifar10)")
    t.add_argument("--wd", type=nonnegative_float, help="weight decay (default: the task's; 5e-4 for cifar10)")
    t.add_argument("--optimizer", choices=OPTIMIZERS, help="default: the task's (sgd for cifar10, adam for sr)")
    t.add_argument("--batch-size", type=positive_int, default=128)
    t.add_argument("--limit", type=positive_int, help="use only the first LIMIT images of each split (smoke runs)")
    t.add_argument("--eval-every", action="store_true", help="evaluate after every epoch")
    t.add_argument("--seed", type=int, default=0, help="seeds init, data order and augmentation")
    add_threads(t)
    add_device_args(t)
    t.add_argument("--cache-dir", help="imagefolder: where train.tar/val.tar are unpacked (default ~/.cache/disco)")
    t.add_argument("--out", required=True, help="checkpoint to write (.safetensors); resumes if interrupted")
    t.set_defaults(func=cmd_train)
