"""Every generated page, table block and plot, and what each is generated from.

- :data:`TABLES`: a block ``<!-- table:NAME -->`` ... ``<!-- /table:NAME -->`` of README.md, docs/*.md or
  bench/README.md -> (the results JSON it reads, its renderer). A tuple of names gives the renderer
  ``{name: data}`` of those present; a single missing file leaves the block as it is.
- :data:`WHOLE_PAGES`: a page written whole (then its blocks filled) -> (its JSON, its writer).
- :data:`PLOTS`: results/NAME.png -> (its JSON, its plotter).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from . import architectures, choosing_split, codecs, edge, latency_model, pretrained, selection_long, serving
from .latency import latency_bench, latency_headline, latency_short, plot_latency
from .measured import faults_table, latency_weight_table, placement_table, planner_validation, soak_table
from .plots import plot_cifar10, plot_cifar10_vit, plot_det, plot_seg, plot_sr
from .selection import budget_comparison, plot_selection, selection_table, selection_verdict
from .tasks import (
    HEADLINE,
    PRETRAINED,
    cifar10_resnet,
    det_lr,
    det_ssd,
    headline,
    imagenette_resnet,
    model_size,
    seg_deeplabv3plus,
    sr_rrdbnet,
)

ROOT = Path(__file__).resolve().parents[2]
Source = str | tuple[str, ...]
LONG = (selection_long.LONG, selection_long.DENSE)

TABLES: dict[str, tuple[Source, Callable]] = {
    "cifar10_resnet": ("cifar10_resnet", cifar10_resnet),
    "cifar10_vit": ("cifar10_vit", cifar10_resnet),
    "cifar10_vit_size": ("cifar10_vit", model_size),
    "sr_rrdbnet": ("sr_rrdbnet", sr_rrdbnet),
    "sr_size": ("sr_rrdbnet", model_size),
    "seg_deeplabv3plus": ("seg_deeplabv3plus", seg_deeplabv3plus),
    "seg_size": ("seg_deeplabv3plus", model_size),
    "det_ssd": ("det_ssd", det_ssd),
    "det_size": ("det_ssd", model_size),
    "det_lr": ("det_ssd_lr", det_lr),
    "det_ssd_small": ("det_ssd_small", det_ssd),
    "det_small_size": ("det_ssd_small", model_size),
    "imagenette_resnet": ("imagenette_resnet", imagenette_resnet),
    "latency": ("latency", latency_headline),
    "latency_short": ("latency", latency_short),
    "latency_bench": ("latency", latency_bench),
    "headline": ((*HEADLINE, PRETRAINED), headline),
    "faults": ("faults", faults_table),
    "soak": ("soak", soak_table),
    "selection": ("cifar10_selection", selection_table),
    "selection_verdict": ("cifar10_selection", selection_verdict),
    "budget_comparison": ("cifar10_selection", budget_comparison),
    "selection_long": (LONG, selection_long.page_section),
    "selection_long_budgets": (LONG, selection_long.budgets),
    "selection_long_messages": (LONG, selection_long.latency_weight_line),
    "selection_long_verdict": (LONG, selection_long.lasso_verdict),
    "selection_tune": ((selection_long.LONG, selection_long.TUNE), selection_long.tune_screen),
    "edge": ((edge.EDGE, edge.PINGPONG, edge.ARCHITECTURES, edge.FLOOR), edge.page_section),
    "edge_headline": ((edge.EDGE,), edge.headline),
    "paper_profile": ((selection_long.PROFILE, selection_long.DENSE), selection_long.paper_profile),
    "latency_weight": ("latency_weight", latency_weight_table),
    "planner_validation": ("planner_validation", planner_validation),
    "placement": ("placement", placement_table),
    "hybrids": ("architectures_hybrids", architectures.hybrids_table),
    "serving": (serving.SERVE, serving.section),
}
WHOLE_PAGES: dict[str, tuple[str, Callable[[object, Path], str]]] = {
    "docs/architectures.md": ("architectures", lambda data, results: architectures.page(data)),
    "docs/codecs.md": ("codecs", codecs.page),
    "docs/choosing-a-split.md": ("plan_resnet50", lambda data, results: choosing_split.page(data)),
    "docs/latency-model.md": ("latency_model", latency_model.page),
    "docs/results-pretrained.md": (pretrained.NAME, pretrained.page),
}
_SAME_NAME_PLOTS = dict(cifar10_resnet=plot_cifar10, cifar10_vit=plot_cifar10_vit, sr_rrdbnet=plot_sr,
                        seg_deeplabv3plus=plot_seg, det_ssd=plot_det, latency=plot_latency,
                        cifar10_selection=plot_selection)  # results/NAME.png from results/NAME.json
PLOTS: dict[str, tuple[Source, Callable[[object, Path], None]]] = {
    **{name: (name, plot) for name, plot in _SAME_NAME_PLOTS.items()},
    "cifar10_selection_long": (LONG, selection_long.plot),
}
MARKER = re.compile(r"(<!-- table:(\w+) -->\n).*?(<!-- /table:\2 -->)", re.S)


class Results:
    """The JSON files of one results folder, each read once (None for a missing one)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._cache: dict[str, object] = {}

    def get(self, name: str) -> object:
        if name not in self._cache:
            f = self.folder / f"{name}.json"
            self._cache[name] = json.loads(f.read_text()) if f.is_file() else None
        return self._cache[name]

    def source(self, source: Source) -> object:
        """One file's data, or ``{name: data}`` of the present files of a tuple."""
        if isinstance(source, tuple):
            return {s: self.get(s) for s in source if self.get(s) is not None}
        return self.get(source)


def pages(root: Path = ROOT) -> list[Path]:
    """The pages whose blocks are generated: README.md, docs/*.md and bench/README.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md")), root / "bench" / "README.md"]


def render(text: str, results: Path | Results) -> str:
    """``text`` with every block regenerated from the JSON in ``results`` (a block whose JSON is missing is
    left as it is; an unknown block name is an error)."""
    res = results if isinstance(results, Results) else Results(results)

    def body(m: re.Match) -> str:
        if m.group(2) not in TABLES:
            raise KeyError(f"unknown table marker {m.group(2)!r} (known: {', '.join(TABLES)})")
        source, table = TABLES[m.group(2)]
        data = res.source(source)
        if data is None:
            return m.group(0)
        return m.group(1) + table(data) + "\n" + m.group(3)

    return MARKER.sub(body, text)


def expected(root: Path = ROOT, results: Path | None = None) -> dict[Path, str]:
    """Every generated page -> the text the generator gives it from the JSON (whole pages written from their
    JSON, every page's blocks filled). A page absent from ``root`` is skipped."""
    res = Results(results or root / "results")
    out: dict[Path, str] = {}
    for rel, (name, write) in WHOLE_PAGES.items():
        data = res.get(name)
        if data is not None:
            out[root / rel] = render(write(data, res.folder), res)
    for page in pages(root):
        if page not in out and page.is_file():
            out[page] = render(page.read_text(), res)
    return out


def write_plots(results: Path, only: list[str] | None = None) -> list[Path]:
    """Every plot (of ``only``, when given) whose JSON is there, written next to it; the paths written."""
    res, done = Results(results), []
    for name, (source, plot) in PLOTS.items():
        if only is not None and name not in only:
            continue
        data = res.source(source)
        if data is None or (isinstance(source, tuple) and source[0] not in data):
            continue
        plot(data, res.folder / f"{name}.png")
        done.append(res.folder / f"{name}.png")
    return done
