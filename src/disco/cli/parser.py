"""The ``disco`` parser's shared pieces: one-line errors (exit 2), defaults shown in the help, task names."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from ..errors import EXIT_REFUSED
from ..validate import positive_int

OPTIMIZERS = ("sgd", "adam", "adamw")


def task_names() -> list[str]:
    """The registered tasks, for the help of ``--task``."""
    from ..tasks import task_names as names

    return names()


def add_threads(p: argparse.ArgumentParser) -> None:
    """``--threads``: torch threads of the command (applied by :func:`disco.cli.main`)."""
    p.add_argument("--threads", type=positive_int, help="torch threads (default: torch's choice)")


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
