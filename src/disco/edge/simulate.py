"""Run the N ranks of an ONNX export in one process (numpy + onnxruntime, no torch), for the export's proof.

A thin driver: each rank is the node engine (:class:`disco_edge.engine.Engine`, the one interpreter of a
schedule) over the in-process transport (:mod:`disco_edge.local`), so the proof checks the code the nodes run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

ONNX_FORMAT = "disco-onnx-schedule/1"


def simulate(folder: str | Path, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Run every ``rankR/`` of export ``folder`` on ``inputs`` (rank 0's, by name): the leader's outputs by
    name, and counters (messages and link values the engines sent)."""
    from disco_edge.local import run_group

    outs, engines = run_group(folder, inputs)
    counters = {"messages": sum(e.counters.messages for e in engines),
                "link_values": sum(e.counters.payload_bytes for e in engines) // 4}  # fp32 on the wire
    return dict(zip((o["name"] for o in engines[0].b.schedule["outputs"]), outs, strict=True)), counters
