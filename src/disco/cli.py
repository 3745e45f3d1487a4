"""The ``disco`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any, NoReturn

import torch

from .runtime.errors import EXIT_REFUSED, exit_code
from .validate import nonnegative_float, nonnegative_int, positive_float, positive_int

log = logging.getLogger("disco")
NOTICE = "disco.notice"  # logger for what a user must hear without -v (resumed, skipped, wrote)


def _threads(args: argparse.Namespace) -> None:
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)


def cmd_train(args: argparse.Namespace) -> int:
    from . import distributed as D
    from .api import train_checkpoint
    from .validate import prepare_output

    out = prepare_output(args.out, create=False)
    res = train_checkpoint(args.task, args.data, out, model=args.model, weights=args.weights,
                           epochs=args.epochs, lr=args.lr, weight_decay=args.wd, optimizer=args.optimizer,
                           batch_size=args.batch_size, limit=args.limit, seed=args.seed, eval_every=args.eval_every,
                           num_classes=args.num_classes, image_size=args.image_size, workers=args.workers,
                           cache_dir=args.cache_dir, device=args.device, amp=args.amp)
    if D.is_main():
        print(json.dumps(res))
    return 0


OPTIMIZERS = ("sgd", "adam", "adamw")


def _task_names() -> list[str]:
    from .tasks.registry import _TASKS

    return sorted(_TASKS)


class HelpFormatter(argparse.HelpFormatter):
    """Shows ``(default: X)`` after every option that has a default its help does not already state."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if (d is None or d is False or d is argparse.SUPPRESS or "default:" in text.lower()
                or "(default" in text.lower() or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


class Parser(argparse.ArgumentParser):
    """An argument parser whose help shows every default and whose errors are one line (exit 2)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        if action.help is None and action.option_strings and action.default not in (None, False):
            action.help = "default: %(default)s"
        return action

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_REFUSED, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from . import distributed as D

    p = Parser(prog="disco", description="Distributed DNN inference with sparse communications. Exit codes: "
               "0 done, 2 a value or file was refused, 3 a failure during the run.")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level (and tracebacks of failures)")
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="train a dense model (the starting point of DISCO)")
    t.add_argument("--task", default="cifar10", help="task: " + ", ".join(_task_names()))
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
    t.add_argument("--threads", type=positive_int, help="torch threads (default: torch's choice)")
    D.add_device_args(t)
    t.add_argument("--cache-dir", help="imagefolder: where train.tar/val.tar are unpacked (default ~/.cache/disco)")
    t.add_argument("--out", required=True, help="checkpoint to write (.safetensors); resumes if interrupted")
    t.set_defaults(func=cmd_train)

    from .commands import add_core_commands

    add_core_commands(sub)
    from .runtime.cli import add_subcommands
    add_subcommands(sub)
    return p


REFUSED = (ValueError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError, KeyError)


def _one_line(e: BaseException) -> str:
    text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def setup_logging(verbose: bool) -> None:
    """WARNING by default (INFO with -v); the notices of ``disco.notice`` (resume, skip) always show."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s" if verbose
                        else "disco: %(message)s")
    logging.getLogger(NOTICE).setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    """Run one ``disco`` command; returns 0, 2 (refused input) or 3 (failure during the run)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help (0) or a parse error (2, already printed in one line)
        return int(e.code or 0)
    setup_logging(args.verbose)
    from . import distributed as D

    prefix = f"disco {args.cmd}"
    try:
        _threads(args)
        if D.under_torchrun():  # data-parallel train/sparsify/eval (docs/training.md)
            if args.cmd not in ("train", "sparsify", "eval"):
                raise ValueError(f"under torchrun only train, sparsify and eval run (data parallel), not {args.cmd}")
            D.init_from_env(D.resolve_device(getattr(args, "device", None)))
            prefix = f"disco {args.cmd} [rank {D.rank()}]"
            if not D.is_main():
                logging.getLogger().setLevel(logging.WARNING)
        rc = args.func(args)
        sys.stdout.flush()
        return rc
    except BrokenPipeError:  # the reader went away (``disco cost ... --json | head``): end quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"{prefix}: interrupted (the resumable state of the last finished epoch is kept)", file=sys.stderr)
        return 130
    except Exception as e:  # one line; the traceback with -v
        log.debug("stopped", exc_info=True)
        code = EXIT_REFUSED if isinstance(e, REFUSED) else exit_code(e)
        if code == EXIT_REFUSED:
            print(f"{prefix}: error: {_one_line(e)}", file=sys.stderr)
        elif D.active() and isinstance(e, RuntimeError | OSError):  # gloo/NCCL: a peer is gone
            print(f"{prefix}: failed: the data-parallel run lost a rank ({type(e).__name__}: {_one_line(e)[:200]}); "
                  "rerun the same command to resume from the last finished epoch", file=sys.stderr)
        else:
            hint = "" if args.verbose else " (run with -v for the traceback)"
            print(f"{prefix}: failed: {type(e).__name__}: {_one_line(e)}{hint}", file=sys.stderr)
        return code
    finally:
        D.shutdown()


if __name__ == "__main__":
    sys.exit(main())
