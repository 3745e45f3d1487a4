"""Cost model: bytes, FLOPs, weights and peak activation memory per node, for any kept set.

Conventions (all figures are for the partition's input shape, batch included):

* bytes: one link moves its channel plane once (fp32 unless ``bytes_per_value``);
  dense within-layer parallelism keeps every link. The input distribution (the
  leader sends the image to N-1 nodes) and the output gather (non-leader channels of
  the outputs to the leader) are reported apart.
* FLOPs: 2 x multiply-accumulates of the mixing ops over the connections a node
  computes (masked columns skipped), plus the elementwise work of local ops on the
  channels a node owns (replicated tensors count on every node).
* weights: mixing layers: the unmasked weight entries of the rows a node owns (+ its
  bias entries); other parameters with one entry per channel go to that channel's
  owner; any other parameter (and those of replicated tensors) counts on every node.
* peak activation memory: a liveness walk over the graph per node: its own channels
  of each tensor plus the channels it received, freed after their last local use.

Each op kind says what it costs (:meth:`~disco.graph.ops.base.Rule.cost`,
:meth:`~disco.graph.ops.mixing.Mixing.layer_cost`, :meth:`~disco.graph.ops.base.Rule.shard_tensor`);
this module walks the ops and adds them up.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .graph import REPLICATED, Partition
from .graph.liveness import liveness
from .graph.ops import OpCost
from .graph.types import shape_of
from .schedule import KINDS, RankSchedule, build, link_senders


@dataclass
class LayerCost:
    name: str
    tensor: str  # the exchange that feeds it (fx node of the base tensor(s))
    shape: list[int]
    links: int
    kept: int
    dense_bytes: int  # bytes of the links this layer is the first consumer of
    bytes: int
    flops_dense: int
    flops: int


@dataclass
class CostReport:
    nodes: int
    input_shape: list[int]
    ratio: float
    dense_bytes: int
    bytes: int
    input_bytes: int
    output_bytes: int
    stats_bytes: int  # channel reductions (LayerNorm): per-position statistics every node sends every other
    flops_dense: int  # the whole model on one device
    flops_total: int  # summed over the nodes
    flops_per_node: list[int]
    params_dense: int
    params_per_node: list[int]
    peak_activation_bytes_per_node: list[int]
    bytes_per_value: int
    layers: list[LayerCost] = field(default_factory=list)
    bytes_sent_per_node: list[int] = field(default_factory=list)  # link bytes each node sends ...
    bytes_received_per_node: list[int] = field(default_factory=list)  # ... and receives
    shares: list[float] | None = None  # node shares of the channels (None: equal)
    messages_per_inference: int = 0  # point-to-point messages of one inference, all nodes (what disco run counts)

    def to_json(self) -> dict:
        d = asdict(self)
        d["layers"] = [asdict(x) for x in self.layers]
        return d


def message_totals(schedules: list[RankSchedule], bytes_per_value: int = 4) -> dict[str, Any]:
    """Bytes and message counts of one inference, summed over the ranks' schedules: link bytes per sending
    and receiving rank at ``bytes_per_value``, input and output bytes (same), stats bytes (fp32)."""
    n = len(schedules)
    sent, received = [0] * n, [0] * n
    tot = {k: 0 for k in KINDS}
    messages = 0
    for s in schedules:
        for m in s.messages("send"):
            messages += 1
            tot[m.kind] += m.values
            if m.kind == "links":
                sent[s.rank] += m.values * bytes_per_value
                received[m.peer] += m.values * bytes_per_value
    return {"bytes": tot["links"] * bytes_per_value, "input_bytes": tot["input"] * bytes_per_value,
            "output_bytes": tot["output"] * bytes_per_value, "stats_bytes": tot["stats"] * 4,
            "messages": messages, "sent": sent, "received": received}


def _layer_costs(part: Partition, kept: np.ndarray) -> list[OpCost]:
    return [ly.rule.layer_cost(ly, ly.view(part.gm), kept, part.nodes) for ly in part.layers]


def params_per_node(part: Partition, kept: np.ndarray, layer_costs: list[OpCost] | None = None) -> list[int]:
    """Weights each node's shard holds (the same accounting as the exported shards): mixing layers by
    their op kind, a module's other tensors by its op's shard slicing, parameters read with get_attr
    everywhere."""
    n = part.nodes
    per = np.zeros(n, dtype=np.int64)
    counted: set[int] = set()
    for ly, c in zip(part.layers, layer_costs or _layer_costs(part, kept), strict=True):
        per += c.params
        counted.update(id(p) for p in ly.view(part.gm).parameters())
    for node in part.gm.graph.nodes:
        if node.op != "call_module":
            continue
        m = part.gm.get_submodule(node.target)
        op = part.op(node.name)
        owner = part.owner.get(node.name)
        for name, p in m.named_parameters(recurse=False):
            if id(p) in counted:
                continue
            counted.add(id(p))
            per += np.array([op.shard_tensor(m, name, p, owner, j).numel() for j in range(n)], dtype=np.int64)
    if part.relayed:  # exchange placement: a receiver holds the per-channel parameters of what it receives
        masks = [part.received_masks(kept, j) for j in range(n)]
        for node in part.gm.graph.nodes:
            if node.name not in part.relayed or node.op != "call_module":
                continue
            n_ch = len(part.owner[node.name])
            m, op = part.gm.get_submodule(node.target), part.op(node.name)
            for name, p in m.named_parameters(recurse=False):
                if p.dim() >= 1 and p.shape[0] == n_ch:
                    per += np.array([op.slice_param(m, name, p, part.received(node.name, masks[j]), n_ch).numel()
                                     for j in range(n)], dtype=np.int64)
    for p in part.gm.parameters():  # parameters not used by a module call (get_attr): everywhere
        if id(p) not in counted:
            per += p.numel()
    return per.tolist()


def estimate(part: Partition, kept: np.ndarray | None = None, bytes_per_value: int = 4) -> CostReport:
    """The cost of running the partitioned model with links ``kept`` (None: dense within-layer)."""
    kept = part.all_links() if kept is None else np.asarray(kept, dtype=bool)
    n = part.nodes
    gm = part.gm
    by_name = {nd.name: nd for nd in gm.graph.nodes}

    # ---- FLOPs: each op's own cost
    flops = np.zeros(n, dtype=np.int64)
    layer_costs = _layer_costs(part, kept)
    layer_rows: list[LayerCost] = []
    first_consumer: set[int] = set()
    link_t = part.links.tensor
    for ly, c in zip(part.layers, layer_costs, strict=True):
        flops += c.flops
        ids = np.unique(ly.col_link[ly.col_link >= 0])
        new = np.array([i for i in ids.tolist() if i not in first_consumer], dtype=np.int64)
        first_consumer.update(new.tolist())
        vals = part.links.values
        tensors = sorted({part.link_tensors[t] for t in link_t[ids].tolist()}) if len(ids) else [ly.input]
        layer_rows.append(LayerCost(
            name=ly.name, tensor=",".join(tensors), shape=list(shape_of(by_name[ly.input])), links=len(ids),
            kept=int(kept[ids].sum()) if len(ids) else 0,
            dense_bytes=int(vals[new].sum()) * bytes_per_value if len(new) else 0,
            bytes=int(vals[new][kept[new]].sum()) * bytes_per_value if len(new) else 0,
            flops_dense=c.flops_dense, flops=int(c.flops.sum()),
        ))
    flops_dense = sum(r.flops_dense for r in layer_rows)
    for node in gm.graph.nodes:
        rule = part.rules.get(node.name)
        c = rule.cost(part, node) if rule is not None else None
        if c is not None:
            flops += c.flops
            flops_dense += c.flops_dense

    msg = message_totals(build(part, kept), bytes_per_value)  # bytes and messages: the schedule's sum
    peak = _peak_memory(part, kept, bytes_per_value)

    return CostReport(
        nodes=n, input_shape=list(part.input_shape), ratio=part.ratio(kept),
        dense_bytes=part.dense_values() * bytes_per_value, bytes=msg["bytes"],
        input_bytes=msg["input_bytes"], output_bytes=msg["output_bytes"], stats_bytes=msg["stats_bytes"],
        flops_dense=int(flops_dense), flops_total=int(flops.sum()), flops_per_node=flops.tolist(),
        params_dense=sum(p.numel() for p in part.gm.parameters()),
        params_per_node=params_per_node(part, kept, layer_costs), peak_activation_bytes_per_node=peak,
        bytes_per_value=bytes_per_value, layers=layer_rows, bytes_sent_per_node=msg["sent"],
        bytes_received_per_node=msg["received"], shares=list(part.shares) if part.shares else None,
        messages_per_inference=msg["messages"],
    )


def link_exchanges(part: Partition) -> np.ndarray:
    """The message each link travels in: one id per (tensor, sending node, receiving node), over link ids."""
    L = part.links
    if not len(L):
        return np.zeros(0, dtype=np.int64)
    sender = link_senders(part)
    key = (L.tensor.astype(np.int64) * part.nodes + sender) * part.nodes + L.receiver
    return np.unique(key, return_inverse=True)[1].astype(np.int64).reshape(-1)


def _peak_memory(part: Partition, kept: np.ndarray, bpv: int) -> list[int]:
    n = part.nodes
    graph_nodes = list(part.gm.graph.nodes)
    live_at = liveness(part)
    # received channel planes per (base tensor, receiver), freed after the last mixing op reading them
    recv = np.zeros((len(part.link_tensors), n), dtype=np.int64)
    np.add.at(recv, (part.links.tensor[kept], part.links.receiver[kept]), part.links.values[kept])
    tensor_idx = {name: k for k, name in enumerate(part.link_tensors)}
    peaks = []
    for j in range(n):
        live = 0
        peak = 0
        frees: dict[int, int] = {}
        for k, nd in enumerate(graph_nodes):
            own = part.owner.get(nd.name)
            rule = part.rules.get(nd.name)
            if own is not None and (rule is None or rule.allocates) and nd.op != "output":
                per_ch = math.prod(shape_of(nd)) // max(1, len(own))
                size = int(((own == j) | (own == REPLICATED)).sum()) * per_ch * bpv
                live += size
                last = live_at.last_use[nd.name]
                frees[last] = frees.get(last, 0) + size
                if nd.name in tensor_idx:
                    r = int(recv[tensor_idx[nd.name], j]) * bpv
                    live += r
                    until = live_at.received_until.get(nd.name, k)
                    frees[until] = frees.get(until, 0) + r
            peak = max(peak, live)
            live -= frees.pop(k, 0)
        peaks.append(peak)
    return peaks


def format_table(rep: CostReport) -> str:
    """A per-layer table and the totals, for the terminal."""
    lines = [f"{'layer':<34}{'input':>18}{'links kept':>14}{'dense KB':>11}{'disco KB':>11}"
             f"{'MFLOP dense':>13}{'MFLOP disco':>13}"]
    for r in rep.layers:
        shp = "x".join(str(s) for s in r.shape[1:])
        lines.append(f"{r.name[:33]:<34}{shp:>18}{f'{r.kept}/{r.links}':>14}{r.dense_bytes / 1e3:>11.1f}"
                     f"{r.bytes / 1e3:>11.1f}{r.flops_dense / 1e6:>13.2f}{r.flops / 1e6:>13.2f}")
    mb = 1e6
    lines += [
        "",
        f"nodes {rep.nodes}, input {tuple(rep.input_shape)}, ratio r = {rep.ratio:.4f}",
        f"bytes moved: dense {rep.dense_bytes / mb:.3f} MB, disco {rep.bytes / mb:.3f} MB "
        f"({rep.dense_bytes / max(rep.bytes, 1):.1f}x less); input distribution {rep.input_bytes / mb:.3f} MB, "
        f"output gather {rep.output_bytes / mb:.3f} MB"
        + (f", LayerNorm statistics {rep.stats_bytes / mb:.3f} MB ({rep.stats_bytes / max(rep.bytes, 1):.1%} of the "
           "link bytes)" if rep.stats_bytes else ""),
        f"FLOPs: one device {rep.flops_dense / 1e9:.3f} G, disco total {rep.flops_total / 1e9:.3f} G "
        f"({rep.flops_total / max(rep.flops_dense, 1):.2f}x), per node "
        + ", ".join(f"{f / 1e9:.3f}" for f in rep.flops_per_node) + " G",
        "link bytes sent per node: " + ", ".join(f"{b / mb:.3f} MB" for b in rep.bytes_sent_per_node)
        + "; received: " + ", ".join(f"{b / mb:.3f} MB" for b in rep.bytes_received_per_node)
        + (f" (shares {', '.join(f'{s:g}' for s in rep.shares)})" if rep.shares else ""),
        f"weights: whole model {rep.params_dense / 1e6:.3f} M, per node "
        + ", ".join(f"{p / 1e6:.3f} M ({p / max(rep.params_dense, 1):.2f}x)" for p in rep.params_per_node),
        "peak activations per node: " + ", ".join(f"{p / mb:.2f} MB" for p in rep.peak_activation_bytes_per_node),
    ]
    return "\n".join(lines)
