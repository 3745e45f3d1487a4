"""The ``disco`` command line: a parser per command group, thin handlers over :mod:`disco.api`.

    train              cli/train.py      dense model
    cost, plan         cli/model.py      bytes, FLOPs and memory of a split; the choice of N, r and codec
    sparsify, eval     cli/sparsify.py   fine-tune into a DISCO model; its metric
    export, run        cli/run.py        shards + manifest; N node processes and their report
    demo               cli/demo.py       the end-to-end story on the embedded model
    serve, infer       cli/serve.py      an ONNX export as a served group; photos to it (docs/serving.md)

Exit codes follow :mod:`disco.errors`: 0 done, 2 refused, 3 failed during the run.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

from ..errors import EXIT_REFUSED, REFUSED_BUILTINS, exit_code
from .parser import Parser

log = logging.getLogger("disco")
NOTICE = "disco.notice"  # logger for what a user must hear without -v (resumed, skipped, wrote)

__all__ = ["NOTICE", "build_parser", "main", "setup_logging"]


def build_parser() -> argparse.ArgumentParser:
    """The ``disco`` parser with every command group."""
    from . import demo, model, run, serve, sparsify, train

    p = Parser(prog="disco", description="Distributed DNN inference with sparse communications. Exit codes: "
               "0 done, 2 a value or file was refused, 3 a failure during the run.")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level (and tracebacks of failures)")
    sub = p.add_subparsers(dest="cmd", required=True)
    for group in (train, model, sparsify, run, demo, serve):
        group.add_commands(sub)
    return p


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


def _start(args: argparse.Namespace) -> str:
    """Apply ``--threads``; under torchrun join the data-parallel group. Returns the prefix of error lines."""
    from .. import distributed as D

    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    if not D.under_torchrun():
        return f"disco {args.cmd}"
    if args.cmd not in ("train", "sparsify", "eval"):  # data-parallel train/sparsify/eval (docs/training.md)
        raise ValueError(f"under torchrun only train, sparsify and eval run (data parallel), not {args.cmd}")
    D.init_from_env(D.resolve_device(getattr(args, "device", None)))
    if not D.is_main():
        logging.getLogger().setLevel(logging.WARNING)
    return f"disco {args.cmd} [rank {D.rank()}]"


def _report(e: Exception, prefix: str, verbose: bool) -> int:
    """One line on stderr for ``e`` (the traceback with -v); returns the exit code."""
    from .. import distributed as D

    if verbose:  # the traceback the one-line message promises
        traceback.print_exception(e, file=sys.stderr)
    code = EXIT_REFUSED if isinstance(e, REFUSED_BUILTINS) else exit_code(e)
    if code == EXIT_REFUSED:
        print(f"{prefix}: error: {_one_line(e)}", file=sys.stderr)
    elif D.active() and isinstance(e, RuntimeError | OSError):  # gloo/NCCL: a peer is gone
        print(f"{prefix}: failed: the data-parallel run lost a rank ({type(e).__name__}: {_one_line(e)[:200]}); "
              "rerun the same command to resume from the last finished epoch", file=sys.stderr)
    else:
        hint = "" if verbose else " (run with -v for the traceback)"
        print(f"{prefix}: failed: {type(e).__name__}: {_one_line(e)}{hint}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    """Run one ``disco`` command; returns 0, 2 (refused input) or 3 (failure during the run)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help (0) or a parse error (2, already printed in one line)
        return int(e.code or 0)
    setup_logging(args.verbose)
    from .. import distributed as D

    prefix = f"disco {args.cmd}"
    try:
        prefix = _start(args)
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
        return _report(e, prefix, args.verbose)
    finally:
        D.shutdown()


if __name__ == "__main__":
    sys.exit(main())
