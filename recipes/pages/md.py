"""Markdown building blocks shared by every generated page: one table writer, mean and spread, optional cells."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence


def _row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def md_table(rows: Iterable[Sequence[object]], columns: Sequence[str]) -> str:
    """A markdown table: the header ``columns``, then one line per row (each cell written with ``str``).

    Every table of every generated page goes through here; a row whose length differs from the header's is an
    error, not a shifted table."""
    lines = [_row(columns), "|" + "---|" * len(columns)]
    for r in rows:
        if len(r) != len(columns):
            raise ValueError(f"row of {len(r)} cells under {len(columns)} columns: {r!r}")
        lines.append(_row(r))
    return "\n".join(lines)


def mean_std(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def opt(x: object, fmt: str = "{:.2f}") -> str:
    """``x`` formatted, or ``-`` when it is missing."""
    return "-" if x is None else fmt.format(x)
