"""The distributed half of ``disco demo``: export, run as N processes, compare with dense and one device."""

from __future__ import annotations

import logging
import tempfile
from typing import Any

import torch

from ..graph import Partition
from ..masks import DiscoModel
from ..timing import median_ms
from .export import export
from .launch import launch

log = logging.getLogger(__name__)


def _single_ms(dm: DiscoModel, x: torch.Tensor, iters: int = 20) -> float:
    """Median latency of the whole model in this process, on one thread like each node."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _time(dm, x, iters)
    finally:
        torch.set_num_threads(threads)


def _time(dm: DiscoModel, x: torch.Tensor, iters: int) -> float:
    with torch.no_grad():
        return median_ms(lambda: dm(x), iters, warmup=3)


def run_demo(dm: DiscoModel, part: Partition, model_spec: dict[str, Any], bandwidth: str = "100mbit",
             iters: int = 20) -> dict[str, Any]:
    """Run the DISCO model and dense within-layer parallelism as real processes; return the figures."""
    x = torch.randn(part.input_shape, generator=torch.Generator().manual_seed(0))
    out: dict[str, Any] = {"single_process_ms": _single_ms(dm.eval(), x)}
    with tempfile.TemporaryDirectory(prefix="disco-demo-") as tmp:
        for name, kept in (("disco", dm.kept), ("dense", part.all_links())):
            d = f"{tmp}/{name}"
            export(dm, part, kept, d, model_spec, probe=x)
            opts = ["--iters", str(iters), "--warmup", "3"]
            log.info("running %s as %d processes", name, part.nodes)
            out[name] = {"unshaped": launch(d, part.nodes, opts),
                         bandwidth: launch(d, part.nodes, opts + ["--bandwidth", bandwidth])}
    return out
