"""Each node's program from the cost model alone, with no run: compute segments as features (FLOPs, ops,
messages, bytes, link values encoded and decoded), sends and waits (see the package's docstring)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..graph import REPLICATED, Partition
from ..graph.capture import shape_of
from ..graph.rules import Mixing
from ..runtime.transport import get_codec

TAG_INPUT, TAG_OUTPUT, TAG_LINKS, TAG_STATS = 1, 2, 16, 1 << 20


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


def programs(part: Partition, kept: np.ndarray, codec: str) -> list[list[tuple]]:
    """Per node: its program with compute segments as feature vectors [FLOPs, ops, messages sent,
    bytes sent, link values encoded, link values decoded] (see :func:`price`), sends and waits,
    predicted from the cost model alone."""
    n = part.nodes
    kept = np.asarray(kept, dtype=bool)
    L = part.links
    gm = part.gm
    nodes = list(gm.graph.nodes)
    by_name = {nd.name: nd for nd in nodes}
    layer_of = {ly.node: ly for ly in part.layers}
    t_index = {name: k for k, name in enumerate(part.link_tensors)}
    senders = np.zeros(len(L), dtype=np.int64)
    for t, name in enumerate(part.link_tensors):
        sel = L.tensor == t
        senders[sel] = part.owner[name][L.channel[sel]]
    msgs: dict[tuple[int, int, int], list[int]] = {}  # (tensor, src, dst) -> [values, channels]
    for i in np.nonzero(kept)[0].tolist():
        m = msgs.setdefault((int(L.tensor[i]), int(senders[i]), int(L.receiver[i])), [0, 0])
        m[0] += int(L.values[i])
        m[1] += 1
    by_tensor: dict[int, list] = {}
    for (t, s, r), vc in sorted(msgs.items()):
        by_tensor.setdefault(t, []).append((s, r, vc))
    progs: list[list[tuple]] = [[] for _ in range(n)]
    waited: list[set] = [set() for _ in range(n)]
    comp = np.zeros((n, len(FEATURES) + len(CODEC_FEATURES)))

    def flush(j: int) -> None:
        if comp[j].any():
            progs[j].append(("c", comp[j].copy()))
            comp[j] = 0.0

    def send(j: int, dst: int, tag: int, nbytes: int, values: int = 0) -> None:
        comp[j, 2] += 1
        comp[j, 3] += nbytes
        comp[j, 4] += values  # encoded before it leaves (link messages only: the others travel as fp32)
        flush(j)
        progs[j].append(("s", dst, tag, nbytes))

    def wait(j: int, src: int, tag: int, nbytes: int, values: int = 0) -> None:
        flush(j)
        progs[j].append(("w", src, tag, nbytes))
        comp[j, 5] += values  # decoded once it has arrived: part of the next compute segment

    in_values = sum(math.prod(shape_of(nd)) for nd in nodes if nd.op == "placeholder" and shape_of(nd) is not None)
    for j in range(1, n):
        send(0, j, TAG_INPUT, in_values * 4)
        wait(j, 0, TAG_INPUT, in_values * 4)
    n_reduce = 0
    for nd in nodes:
        if nd.op in ("placeholder", "output", "get_attr"):
            continue
        ly = layer_of.get(nd.name)
        if ly is not None:
            mask = ly.connection_mask(kept)
            for j in range(n):
                rows = ly.out_owner == j
                if not rows.any():
                    continue
                remote_cols = ly.col_link[j] >= 0
                mj = mask[rows]
                comp[j, 0] += int(mj[:, ~remote_cols].sum()) * 2 * ly.macs_per_connection
                comp[j, 1] += 1
                ids = ly.col_link[j][remote_cols]
                ids = ids[kept[ids]]
                for t, s in sorted(set(zip(L.tensor[ids].tolist(), senders[ids].tolist(), strict=True))):
                    if (t, s) not in waited[j]:
                        waited[j].add((t, s))
                        v, c = msgs[(t, s, j)]
                        wait(j, s, TAG_LINKS + t, message_bytes(codec, v, c), v)
                if len(ids):
                    comp[j, 0] += int(mj[:, remote_cols].sum()) * 2 * ly.macs_per_connection
                    comp[j, 1] += 1
        else:
            rule = part.rules.get(nd.name)
            own = part.owner.get(nd.name)
            if own is not None and rule is not None and rule.kind not in ("view", "static"):
                comp[:, 0] += _op_flops(part, nd, n)
                comp[:, 1] += 1
            if rule is not None and rule.kind == "reduce" and own is not None and not (own == REPLICATED).all():
                nb = getattr(rule, "stats", 2) * (math.prod(shape_of(nd)) // len(own)) * 4
                for j in range(n):
                    for k in range(n):
                        if k != j:
                            send(j, k, TAG_STATS + n_reduce, nb)
                for j in range(n):
                    for k in range(n):
                        if k != j:
                            wait(j, k, TAG_STATS + n_reduce, nb)
                n_reduce += 1
        t = t_index.get(nd.name)
        for s, r, (v, c) in by_tensor.get(t, []) if t is not None else []:
            send(s, r, TAG_LINKS + t, message_bytes(codec, v, c), v)
    out_node = next(nd for nd in nodes if nd.op == "output")
    for a in out_node.all_input_nodes:
        own = part.owner.get(a.name)
        if own is None or (own == REPLICATED).all():
            continue
        per_ch = math.prod(shape_of(by_name[a.name])) // len(own)
        for j in range(1, n):
            c = int((own == j).sum())
            if c:
                send(j, 0, TAG_OUTPUT, c * per_ch * 4)
                wait(0, j, TAG_OUTPUT, c * per_ch * 4)
    for j in range(n):
        flush(j)
        progs[j].append(("f",))
    return progs
