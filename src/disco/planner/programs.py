"""Each node's program from the cost model alone, with no run: compute segments as features (FLOPs, ops,
messages, bytes, link values encoded and decoded), sends and waits (see the package's docstring)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import schedule
from ..graph import REPLICATED, Partition
from ..graph.rules import Mixing
from ..graph.types import shape_of
from ..runtime.transport import get_codec


def message_bytes(codec: str, values: int, channels: int) -> int:
    """Bytes on the wire for ``values`` values of ``channels`` channel planes."""
    c = get_codec(codec)
    return values * c.bytes_per_value + (4 * channels if c.name == "int8" else 0)


def _op_flops(part: Partition, nd: Any, n: int) -> np.ndarray:
    """[N] FLOPs of a channel-local / reduction op (the cost model's convention)."""
    rule, own = part.rules.get(nd.name), part.owner.get(nd.name)
    if rule is None or isinstance(rule, Mixing) or rule.kind in ("view", "static") or own is None:
        return np.zeros(n)
    shp = shape_of(nd)
    per_ch = math.prod(shp) // len(own)
    first = next((a for a in nd.all_input_nodes if part.owner.get(a.name) is not None), None)
    fpe = rule.flops_per_element(shape_of(first) if first is not None else None, shp)
    counts = np.full(n, len(own)) if (own == REPLICATED).all() else np.bincount(own[own >= 0], minlength=n)
    return counts * per_ch * fpe


FEATURES = ("flops", "ops", "msgs", "bytes")  # what a compute segment is made of (priced by Calibration)
CODEC_FEATURES = ("encoded", "decoded")  # ... and the link values it encodes and decodes (priced per codec)


def _mix_flops(ly: Any, mask: np.ndarray, j: int, half: str) -> tuple[int, int]:
    """(FLOPs, ops) of one half of mixing layer ``ly`` on node ``j`` (``mask``: its connection mask)."""
    rows = ly.out_owner == j
    if not rows.any():
        return 0, 0
    remote = ly.col_link[j] >= 0
    cols = remote if half == "remote" else ~remote
    return int(mask[rows][:, cols].sum()) * 2 * ly.macs_per_connection, 1


def programs(part: Partition, kept: np.ndarray, codec: str, input_at: str = "leader") -> list[list[tuple]]:
    """Per node: its schedule (:func:`disco.schedule.build`) as a program with compute segments as
    feature vectors [FLOPs, ops, messages sent, bytes sent, link values encoded, link values decoded]
    (see :func:`disco.planner.pricing.price`), sends ``("s", dst, tag, bytes)`` and waits ``("w", src, tag, bytes)``.
    ``input_at="every-node"``: every node reads the input itself, so the input messages are left out (as the
    run's ``--input-at every-node`` leaves them)."""
    n = part.nodes
    kept = np.asarray(kept, dtype=bool)
    by_name = {nd.name: nd for nd in part.gm.graph.nodes}
    layer_of = {ly.node: ly for ly in part.layers}
    masks = {ly.node: ly.connection_mask(kept) for ly in part.layers}
    op_flops = {name: _op_flops(part, nd, n) for name, nd in by_name.items()}
    progs: list[list[tuple]] = [[] for _ in range(n)]
    for sch in schedule.build(part, kept):
        j, prog = sch.rank, progs[sch.rank]
        comp = np.zeros(len(FEATURES) + len(CODEC_FEATURES))
        for st in sch.steps:
            if isinstance(st, schedule.Run):
                ly = layer_of.get(st.node)
                if ly is not None and st.half in ("local", "remote"):
                    comp[:2] += _mix_flops(ly, masks[st.node], j, st.half)
                elif ly is None and st.half in ("all", "partial") and _computes(part, st.node):
                    comp[:2] += (op_flops[st.node][j], 1)
                continue
            if st.kind == "input" and input_at == "every-node":
                continue
            links = st.kind == "links"
            nbytes = message_bytes(codec, st.values, len(st.channels)) if links else st.values * 4
            if st.op == "send":
                comp[2:5] += (1, nbytes, st.values if links else 0)  # encoded before it leaves
            if comp.any():
                prog.append(("c", comp.copy()))
                comp[:] = 0.0
            prog.append(("s" if st.op == "send" else "w", st.peer, st.tag, nbytes))
            if st.op == "recv" and links:
                comp[5] += st.values  # decoded once it has arrived: part of the next compute segment
        if comp.any():
            prog.append(("c", comp.copy()))
        prog.append(("f",))
    return progs


def _computes(part: Partition, name: str) -> bool:
    """Whether fx node ``name`` is an op with a cost of its own (not a view, a constant or a mixing op)."""
    rule = part.rules.get(name)
    return part.owner.get(name) is not None and rule is not None and rule.kind not in ("view", "static")

