"""Rewrite every generated page, table block and plot from results/*.json (no number is typed by hand).

    python -m recipes.pages             # rewrite every page, block and plot
    python -m recipes.pages --check     # exit 1 if a page is not what the JSON gives (no file written)
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .registry import ROOT, expected, render, write_plots

log = logging.getLogger("recipes.pages")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m recipes.pages", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, default=ROOT / "results", help="folder of the JSON files and plots")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page differs from the JSON")
    p.add_argument("--no-plots", action="store_true", help="rewrite the pages only")
    p.add_argument("--pages", nargs="+", type=Path,
                   help="fill only the blocks of these pages (e.g. a copy elsewhere); a missing one is skipped")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.pages:
        want = {page: render(page.read_text(), args.results) for page in args.pages if page.is_file()}
    else:
        want = expected(ROOT, args.results)
    stale = [page for page, text in want.items() if not page.is_file() or page.read_text() != text]
    for page in stale:
        if args.check:
            log.info("%s is not what the JSON gives: run python -m recipes.pages", page)
        else:
            page.write_text(want[page])
            log.info("wrote %s", page)
    if args.check:
        return 1 if stale else 0
    if not args.no_plots:
        for path in write_plots(args.results):
            log.info("wrote %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
