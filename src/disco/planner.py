"""``disco plan``: choose N, r, the wire codec (and node shares) for a given link and set of devices.

For every candidate (N, shares, r, codec) the planner builds each node's program from the cost
model alone, with no run: walking the graph in order, each op becomes a compute segment
(FLOPs / the node's calibrated rate + a fixed cost per op and per message), each exchange a
send on the owner and a wait on the receiver at the first mixing op that reads it (the local half
of a mixing op first, as the executor does), plus the input distribution, the LayerNorm
statistics and the output gather. :func:`disco.runtime.latency.replay` replays these programs
against the link model (bandwidth per node interface, one-way latency, per-message delay and
per-message overhead, the node processes sharing ``cores`` cores when they share a host).

The calibration (compute rate, per-op and per-message costs, delay and overheads) is fitted by
``bench/latency_fit.py`` on ``results/latency.json`` and stored in ``results/latency_model.json``;
the defaults below are that fit, so an installed package plans without the repository.
"""

from __future__ import annotations

import copy
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .checkpoint import is_checkpoint
from .graph import REPLICATED, Partition
from .graph.rules import Mixing
from .graph.types import shape_of
from .runtime import latency as lat
from .runtime.transport import LinkModel, get_codec

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
TAG_INPUT, TAG_OUTPUT, TAG_LINKS, TAG_STATS = 1, 2, 16, 1 << 20


@dataclass
class Calibration:
    """The latency model's parameters (see ``bench/latency_fit.py``)."""

    flop_s: float = 1.407e-11  # seconds per FLOP on one core (1 torch thread)
    op_s: float = 2.142e-05  # fixed cost of one op on one node (Python, dispatch)
    msg_s: float = 4.009e-05  # fixed CPU cost of one message on its sender (index_select, encode)
    byte_s: float = 4.381e-10  # CPU cost per payload byte (gather, cast, copy) on the sender
    delay_a: float = 0.0005513  # delivery delay of one message: a + b * bytes (unpaced gloo) ...
    delay_b: float = 1.5e-09
    delay_paced_a: float = 0.0001  # ... and through the pacing thread
    delay_paced_b: float = 2.5e-10
    overhead_unshaped_s: float = 0.0001  # CPU time after each received message, unshaped links
    overhead_paced_s: float = 0.0002  # ... and paced ones (pacing thread hand-off)
    overhead_unshaped_byte_s: float = 5e-10  # ... plus this per received byte (unshaped)
    overhead_paced_byte_s: float = 3e-09  # ... (paced)
    wake_unshaped_s: float = 0.0001  # wake-up of a node blocked on a message that had not arrived (unshaped)
    wake_paced_s: float = 5e-05  # ... (paced)
    oversub: float = 0.9  # useful share of the cores while more node processes compute than there are cores
    corun: float = 0.85  # speed of each node process while more than one computes at once on a shared host
    wake_oversub_s: float = 0.0  # extra wake-up while node processes outnumber the cores (waiting for a core)
    busy_s: float = 0.0003  # extra delay of a message sent while the other nodes' computing fills the cores
    single_process: dict[str, float] = field(default_factory=dict)  # model -> measured one-process ms
    single_process_source: str = "results/latency.json"
    # codec -> seconds per value that encoding (sender) and decoding (receiver) cost beyond fp32's
    # (bench/codec_cost.py; fp32 is a view both ways, int8 takes a max-abs pass, a division and a cast)
    codec_encode_s: dict[str, float] = field(default_factory=dict)
    codec_decode_s: dict[str, float] = field(default_factory=dict)
    source: str = "defaults"

    @classmethod
    def load(cls, path: str | Path | None = None) -> Calibration:
        p = Path(path) if path else RESULTS / "latency_model.json"
        if not p.is_file():
            return cls()
        d = json.loads(p.read_text())
        known = {k: v for k, v in d.get("calibration", {}).items() if k in cls.__dataclass_fields__}
        return cls(**known, source=str(p.name))

    def wake(self, paced: bool, oversubscribed: bool) -> float:
        """Wake-up of a node blocked on a message, with the wait for a core when processes outnumber them."""
        return (self.wake_paced_s if paced else self.wake_unshaped_s) + (self.wake_oversub_s if oversubscribed else 0)

    def delay(self, paced: bool = False) -> lat.Delay:
        return lat.Delay(self.delay_paced_a, self.delay_paced_b) if paced else lat.Delay(self.delay_a, self.delay_b)


# ---- programs from the cost model -------------------------------------------------------------

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


def price(progs: list[list[tuple]], cal: Calibration, speeds: list[float] | None = None,
          compute_ms: list[float] | None = None, codec: str = "fp32") -> list[list[lat.Step]]:
    """Programs in seconds: each feature segment priced by ``cal`` (the link values at ``codec``'s
    encode and decode cost) and divided by the node's speed; ``compute_ms``: rescale each node's
    segments to this measured total instead (checks of the link model)."""
    w = np.array([cal.flop_s, cal.op_s, cal.msg_s, cal.byte_s,
                  cal.codec_encode_s.get(codec, 0.0), cal.codec_decode_s.get(codec, 0.0)])
    out = []
    for j, p in enumerate(progs):
        sp = 1.0 if speeds is None else float(speeds[j])
        secs = [float(s[1] @ w[:len(s[1])]) / sp if s[0] == "c" else 0.0 for s in p]
        if compute_ms is not None:
            tot = sum(secs)
            k = compute_ms[j] / 1e3 / tot if tot > 0 else 0.0
            secs = [x * k for x in secs]
        out.append([("c", x) if s[0] == "c" else s for s, x in zip(p, secs, strict=True)])
    return out


def features(progs: list[list[tuple]]) -> np.ndarray:
    """[N, 4]: each node's total FLOPs, ops, messages sent and bytes sent (the fitted features)."""
    k = len(FEATURES)
    return np.array([sum((s[1][:k] for s in p if s[0] == "c"), np.zeros(k)) for p in progs])


def with_overheads(progs: list[list[lat.Step]], per_msg: float, per_byte: float = 0.0,
                   speeds: Sequence[float] | None = None) -> list[list[lat.Step]]:
    """CPU time after every received message: ``per_msg + per_byte * bytes`` (receive-side runtime cost), on
    node j divided by its relative speed ``speeds[j]`` (as :func:`price` divides its compute)."""
    if per_msg <= 0 and per_byte <= 0:
        return progs
    sp = [1.0] * len(progs) if speeds is None else [float(v) for v in speeds[:len(progs)]]
    return [[x for s in p for x in ((s, ("c", (per_msg + per_byte * s[3]) / sp[j])) if s[0] == "w" else (s,))]
            for j, p in enumerate(progs)]


def predict_ms(progs: list[list[lat.Step]], bandwidth_bps: float | None, latency_s: float, cal: Calibration,
               cores: int | None = None, speeds: Sequence[float] | None = None) -> float:
    """Predicted ms of one inference (priced programs, ``speeds`` as :func:`price` had them): ``cores`` host
    cores shared by the node processes (None: one device per node)."""
    link = LinkModel(bandwidth_bps, latency_s)
    if link.shaped:
        progs = with_overheads(progs, cal.overhead_paced_s, cal.overhead_paced_byte_s, speeds)
    else:
        progs = with_overheads(progs, cal.overhead_unshaped_s, cal.overhead_unshaped_byte_s, speeds)
    wake = cal.wake(link.shaped, len(progs) > (cores or len(progs)))
    return lat.replay(progs, link, cores or len(progs), cal.delay(link.shaped), wake, cal.oversub,
                      cal.corun if cores else 1.0, busy_s=cal.busy_s if cores else 0.0) * 1e3


# ---- the planner ------------------------------------------------------------------------------

@dataclass
class Candidate:
    nodes: int
    ratio: float
    ratio_target: float
    codec: str
    shares: list[float] | None
    predicted_ms: float
    bytes: int  # link payload bytes per inference (codec applied)
    bytes_per_node_sent: list[int]
    params_per_node: list[int]
    weight_bytes_per_node: list[int]
    peak_activation_bytes_per_node: list[int]
    memory_bytes_per_node: list[int]
    accuracy: float | None = None
    accuracy_source: str | None = None
    fits_memory: bool = True
    pareto: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _accuracy_table(model: str) -> list[dict[str, Any]]:
    """Known (N, r, codec) -> metric for ``model`` from results/*.json (recipes) and codecs.json."""
    rows: list[dict[str, Any]] = []
    for f in sorted(RESULTS.glob("*.json")) if RESULTS.is_dir() else []:
        if f.name in ("latency.json", "latency_model.json", "codecs.json", "planner_validation.json"):
            continue
        try:
            d = json.loads(f.read_text())
        except json.JSONDecodeError:
            continue
        entries = d.get("entries", d.get("runs", [])) if isinstance(d, dict) else d
        if not isinstance(entries, list):
            continue
        for e in entries:
            if not isinstance(e, dict) or e.get("model", d.get("model") if isinstance(d, dict) else None) != model:
                continue
            metric = next((k for k in ("top1", "miou", "map", "psnr_set14", "psnr_set5") if k in e), None)
            if metric is None or "nodes" not in e:
                continue
            rows.append({"nodes": e["nodes"], "ratio": e.get("target_ratio", e.get("ratio", 1.0)),
                         "shares": e.get("shares"), "codec": "fp32", "metric": metric, "value": e[metric],
                         "source": f"results/{f.name}"})
    return rows


QUALITY_METRICS = ("top1", "top5", "miou", "pixel_acc", "map", "map50")


def is_quality_metric(key: str) -> bool:
    """A task metric where higher is better and a drop is an accuracy loss (not a count, a timing such as
    detection's ``model_ms``, a per-class IoU or the bicubic baseline of super-resolution)."""
    return key in QUALITY_METRICS or key.startswith("psnr_")


def codec_drops() -> dict[str, float]:
    """Per codec: the worst metric drop against fp32 over the checkpoints of results/codecs.json."""
    p = RESULTS / "codecs.json"
    if not p.is_file():
        return {"fp32": 0.0}
    d = json.loads(p.read_text())
    base: dict[str, dict[str, float]] = {}
    for e in d["entries"]:
        if e["codec"] == "fp32":
            base[e["checkpoint"]] = e["metrics"]
    out: dict[str, float] = {}
    for e in d["entries"]:
        b = base.get(e["checkpoint"])
        if b is None:
            continue
        drops = [b[k] - v for k, v in e["metrics"].items() if k in b and is_quality_metric(k)]
        out[e["codec"]] = max(out.get(e["codec"], 0.0), max(drops, default=0.0))
    return out


def pareto_front(cands: list[Candidate]) -> list[Candidate]:
    """Candidates no other beats on both latency and accuracy. Where no candidate has a known accuracy,
    the communication ratio r stands for it (more links kept, closer to the dense model)."""
    proxy = not any(c.accuracy is not None for c in cands)

    def q(c: Candidate) -> float:
        if proxy:
            return c.ratio_target
        return c.accuracy if c.accuracy is not None else -math.inf

    front = []
    for c in cands:
        dominated = any(o.predicted_ms <= c.predicted_ms and q(o) >= q(c)
                        and (o.predicted_ms < c.predicted_ms or q(o) > q(c)) for o in cands if o is not c)
        if not dominated:
            front.append(c)
    return sorted(front, key=lambda c: c.predicted_ms)


@dataclass
class PlanRequest:
    model: str
    input_shape: tuple[int, ...]
    bandwidth_bps: float | None
    latency_s: float = 0.0
    nodes: tuple[int, ...] = (2, 3, 4)
    codecs: tuple[str, ...] = ("fp32", "fp16", "int8")
    ratios: tuple[float, ...] = (1.0, 0.2, 0.1, 0.05, 0.0)
    max_memory_per_node: int | None = None
    speeds: tuple[float, ...] | None = None
    shares: tuple[float, ...] | None = None  # plan N = len(shares) with these node shares only
    cores: int | None = None  # all nodes on one host with this many cores (None: one device per node)
    max_drop: float = 1.0  # accuracy points below the best known that the recommendation may lose
    min_ratio: float = 0.1  # without accuracy data, recommend r >= this only
    max_codec_drop: float = 0.3  # a codec whose measured worst drop exceeds this is not recommended blind
    weights: str | None = None
    time_host: bool = False  # time the model here (one process, 1 thread) and scale the CPU costs to this host


def _prepare(req: PlanRequest) -> tuple[Any, str, dict[str, Any]]:
    """(the plain model, its name, checkpoint facts or {})."""
    import torch

    from .models import build_model

    p = Path(req.model)
    if is_checkpoint(req.model):
        from .loading import load

        loaded = load(p)
        name = loaded.ckpt.model["name"]
        plain = build_model(name, **loaded.ckpt.model.get("kwargs", {}))
        plain.load_state_dict(loaded.ckpt.state_dict)
        facts = {"checkpoint": str(p), "nodes": loaded.ckpt.nodes, "task": loaded.ckpt.task,
                 "metrics": loaded.ckpt.info.get("metrics", {}),
                 "ratio": (loaded.ckpt.disco or {}).get("ratio", 1.0)}
        return plain.eval(), name, facts
    torch.manual_seed(0)  # the same weights (and so the same magnitude links) as `disco export MODEL`
    return build_model(req.model, weights=req.weights).eval(), req.model, {}


def plan(req: PlanRequest, cal: Calibration | None = None) -> dict[str, Any]:
    """Every candidate with its predictions, the Pareto front and the recommended point."""
    from .cost import estimate
    from .graph import partition
    from .masks import DiscoModel
    from .sparsify import magnitude_scores, select_links

    cal = cal or Calibration.load()
    model, name, facts = _prepare(req)
    shape = tuple(req.input_shape)
    host = None
    if req.time_host:
        cal, host = scaled_to_host(cal, model, name, shape)
    codec_drop = codec_drops()
    acc_rows = _accuracy_table(name)
    speeds = list(req.speeds) if req.speeds else None
    if speeds is not None and len(speeds) < max(req.nodes):
        raise ValueError(f"--speeds has {len(speeds)} entries; N up to {max(req.nodes)} needs one per node")
    cands: list[Candidate] = []
    for n in req.nodes:
        share_opts: list[tuple[float, ...] | None] = [None]
        if req.shares is not None:
            if len(req.shares) != n:
                continue
            share_opts = [tuple(req.shares)]
        elif speeds is not None and len(set(speeds[:n])) > 1:
            share_opts.append(tuple(speeds[:n]))
        for shares in share_opts:
            part = partition(model, shape, n, shares)  # once per (N, shares): every ratio and codec reuse it
            scores = magnitude_scores(DiscoModel(copy.deepcopy(model), part))
            for r in req.ratios:
                kept = part.all_links() if r >= 1 else select_links(part, scores, r, "global")
                rep = estimate(part, kept)
                weights = [4 * p for p in rep.params_per_node]
                mem = [w + a for w, a in zip(weights, rep.peak_activation_bytes_per_node, strict=True)]
                for codec in req.codecs:
                    progs = price(programs(part, kept, codec), cal, speeds, codec=codec)
                    ms = predict_ms(progs, req.bandwidth_bps, req.latency_s, cal, req.cores, speeds)
                    bpv = get_codec(codec).bytes_per_value
                    acc, src = _accuracy_for(acc_rows, facts, n, r, shares, codec, codec_drop)
                    cands.append(Candidate(
                        nodes=n, ratio=round(rep.ratio, 4), ratio_target=r, codec=codec,
                        shares=list(shares) if shares else None, predicted_ms=round(ms, 2),
                        bytes=rep.bytes // 4 * bpv, bytes_per_node_sent=[b // 4 * bpv for b in rep.bytes_sent_per_node],
                        params_per_node=rep.params_per_node, weight_bytes_per_node=weights,
                        peak_activation_bytes_per_node=rep.peak_activation_bytes_per_node,
                        memory_bytes_per_node=mem, accuracy=acc, accuracy_source=src,
                        fits_memory=req.max_memory_per_node is None or max(mem) <= req.max_memory_per_node))
            del part, scores
    single = _single_process(model, name, shape, cal)
    feasible = [c for c in cands if c.fits_memory]
    for c in pareto_front(feasible):
        c.pareto = True
    rec = recommend(feasible, req, codec_drop)
    return {"model": name, "input_shape": list(shape), "bandwidth_bps": req.bandwidth_bps, "latency_s": req.latency_s,
            "cores": req.cores, "speeds": speeds, "calibration": cal.source, "host": host,
            "checkpoint": facts or None,
            "single_process": single, "codec_worst_drop": codec_drop,
            "candidates": [c.to_json() for c in cands],
            "recommended": None if rec is None else rec.to_json(),
            "why": _why(rec, req, single)}


def _accuracy_for(rows: list[dict[str, Any]], facts: dict[str, Any], n: int, r: float,
                  shares: tuple[float, ...] | None, codec: str, drop: dict[str, float]
                  ) -> tuple[float | None, str | None]:
    if codec not in drop:
        return None, None
    cands = [x for x in rows if x["nodes"] == n and abs(x["ratio"] - r) < 1e-6
             and (tuple(x["shares"]) if x.get("shares") else None) == shares]
    if facts and facts.get("nodes") == n and abs(facts.get("ratio", 1) - r) < 0.02 and facts.get("metrics"):
        m = facts["metrics"]
        k = next((k for k in ("top1", "miou", "map", "psnr_set14", "psnr_set5") if k in m), None)
        if k:
            cands.append({"value": m[k], "source": f"checkpoint {Path(facts['checkpoint']).name} ({k})"})
    if not cands:
        return None, None
    best = max(cands, key=lambda x: x["value"])
    d = drop.get(codec, 0.0)
    return round(best["value"] - d, 3), best["source"] + (f", minus the worst {codec} drop {d:.2f}" if d else "")


def recommend(cands: list[Candidate], req: PlanRequest, drop: dict[str, float]) -> Candidate | None:
    """The fastest candidate that keeps accuracy: with known accuracies, within ``max_drop`` of the best
    known; without, r >= ``min_ratio`` and a codec whose measured worst drop is at most ``max_codec_drop``."""
    known = [c for c in cands if c.accuracy is not None]
    if known:
        best = max(c.accuracy for c in known)
        ok = [c for c in known if c.accuracy >= best - req.max_drop]
    else:
        ok = [c for c in cands if c.ratio_target >= req.min_ratio and drop.get(c.codec, math.inf) <= req.max_codec_drop]
    return min(ok, key=lambda c: (c.predicted_ms, -c.ratio)) if ok else None


CPU_FIELDS = ("flop_s", "op_s", "msg_s", "byte_s", "overhead_unshaped_s", "overhead_paced_s",
              "overhead_unshaped_byte_s", "overhead_paced_byte_s")


def time_one_process(model: Any, shape: tuple[int, ...], reps: int = 5) -> float:
    """Median ms of one forward of ``model`` in this process on one torch thread (after one warm-up)."""
    import statistics
    import time

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = torch.randn(shape)
        ts = []
        with torch.no_grad():
            model(x)
            for _ in range(reps):
                t0 = time.perf_counter()
                model(x)
                ts.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(ts) * 1e3


def scaled_to_host(cal: Calibration, model: Any, name: str, shape: tuple[int, ...],
                   measured_ms: float | None = None) -> tuple[Calibration, dict[str, Any]]:
    """``cal`` with its CPU costs (compute, per-message and per-byte CPU, codecs) scaled to this host: the
    factor is the model's one-process time here (``measured_ms``, else timed now) over the calibration's (its
    measured one-process time for this model and shape, else its compute model's). Link delays are kept."""
    ref = _single_process(model, name, shape, cal)
    here = time_one_process(model, shape) if measured_ms is None else measured_ms
    f = here / ref["ms"]
    scaled = {k: getattr(cal, k) * f for k in CPU_FIELDS}
    key = f"{name}|{','.join(map(str, shape))}"
    new = replace(
        cal, **scaled, single_process={**cal.single_process, key: round(here, 2)},
        codec_encode_s={k: v * f for k, v in cal.codec_encode_s.items()},
        codec_decode_s={k: v * f for k, v in cal.codec_decode_s.items()},
        single_process_source="timed on this host", source=f"{cal.source}, CPU costs x {f:.2f} for this host")
    return new, {"one_process_ms_here": round(here, 2), "one_process_ms_calibration": ref["ms"],
                 "calibration_one_process_source": ref["source"], "cpu_factor": round(f, 3)}


def _single_process(model: Any, name: str, shape: tuple[int, ...], cal: Calibration) -> dict[str, Any]:
    """The one-process baseline: measured (results/latency.json) at this input shape, else predicted."""
    key = f"{name}|{','.join(map(str, shape))}"
    if key in cal.single_process:
        return {"ms": cal.single_process[key], "source": f"measured ({cal.single_process_source})"}
    from .cost import estimate
    from .graph import partition

    part = partition(model, shape, 1)
    progs = price(programs(part, part.all_links(), "fp32"), cal)
    return {"ms": round(lat.compute_s(progs[0]) * 1e3, 2), "source": "predicted (compute model)",
            "params": estimate(part).params_dense}


def _why(rec: Candidate | None, req: PlanRequest, single: dict[str, Any]) -> str:
    if rec is None:
        return "no candidate fits the memory limit and the accuracy rule"
    s = (f"fastest candidate that keeps accuracy: N={rec.nodes}, r={rec.ratio_target:g}, {rec.codec}"
         + (f", shares {','.join(f'{x:g}' for x in rec.shares)}" if rec.shares else "")
         + f": {rec.predicted_ms:.1f} ms predicted")
    if single.get("ms") is not None and single["ms"] < rec.predicted_ms:
        s += (f"; one process would take {single['ms']:.1f} ms ({single['source']}): split for memory "
              "(weights per node) rather than speed on this link")
    return s


def commands(res: dict[str, Any], req: PlanRequest, out_dir: str = "plan_export") -> list[str]:
    """The exact commands that build and run the recommended point."""
    c = res["recommended"]
    if c is None:
        return []
    shape = ",".join(map(str, res["input_shape"]))
    shares = f" --shares {','.join(f'{x:g}' for x in c['shares'])}" if c["shares"] else ""
    bw = "" if req.bandwidth_bps is None else f" --bandwidth {req.bandwidth_bps / 1e6:g}mbit"
    latf = f" --latency {req.latency_s * 1e3:g}ms" if req.latency_s else ""
    ck = res.get("checkpoint")
    out = []
    if ck:
        if ck["nodes"] == c["nodes"] and abs(ck["ratio"] - c["ratio_target"]) < 0.02:
            src = ck["checkpoint"]
        else:
            src = f"runs/plan_n{c['nodes']}_r{c['ratio_target']:g}.safetensors"
            out.append(f"disco sparsify {ck['checkpoint']} --data DATA --nodes {c['nodes']}{shares} "
                       f"--ratio {c['ratio_target']:g} --out {src}")
        out.append(f"disco export {src} --out {out_dir} --codec {c['codec']}")
    else:
        out.append(f"disco sparsify DENSE_CHECKPOINT --data DATA --nodes {c['nodes']}{shares} "
                   f"--ratio {c['ratio_target']:g} --out runs/{res['model']}_n{c['nodes']}_r{c['ratio_target']:g}"
                   ".safetensors   # for accuracy: fine-tune your trained model")
        out.append(f"disco export {res['model']} --nodes {c['nodes']}{shares} --ratio {c['ratio_target']:g} "
                   f"--input-shape {shape} --out {out_dir} --codec {c['codec']}   # latency check, random weights")
    out.append(f"disco run {out_dir} --nodes {c['nodes']} --codec {c['codec']}{bw}{latf}")
    return out


def format_table(res: dict[str, Any]) -> str:
    """The Pareto front (and the recommended point, marked *) as a terminal table."""
    rows = [c for c in res["candidates"] if c["pareto"] or c == res["recommended"]]
    lines = [f"{'':2}{'N':>2} {'shares':>8} {'r':>6} {'codec':>6} {'pred. ms':>9} {'MB moved':>9} "
             f"{'max weights MB':>15} {'max memory MB':>14} {'accuracy':>9}"]
    for c in sorted(rows, key=lambda c: c["predicted_ms"]):
        mark = "*" if c == res["recommended"] else " "
        sh = ",".join(f"{x:g}" for x in c["shares"]) if c["shares"] else "equal"
        acc = "-" if c["accuracy"] is None else f"{c['accuracy']:.2f}"
        lines.append(f"{mark:2}{c['nodes']:>2} {sh:>8} {c['ratio_target']:>6g} {c['codec']:>6} "
                     f"{c['predicted_ms']:>9.1f} {c['bytes'] / 1e6:>9.3f} "
                     f"{max(c['weight_bytes_per_node']) / 1e6:>15.1f} "
                     f"{max(c['memory_bytes_per_node']) / 1e6:>14.1f} {acc:>9}")
    s = res["single_process"]
    lines.append(f"one process: {s['ms']:.1f} ms ({s['source']})")
    h = res.get("host")
    if h:
        lines.append(f"this host: one process {h['one_process_ms_here']:.1f} ms against "
                     f"{h['one_process_ms_calibration']:.1f} ms in the calibration: CPU costs x {h['cpu_factor']:.2f}")
    lines.append(res["why"])
    return "\n".join(lines)


def plot(res: dict[str, Any], path: str | Path) -> None:
    """Latency of every candidate (x) against accuracy or r (y); the front joined, the choice marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cs = res["candidates"]
    have_acc = any(c["accuracy"] is not None for c in cs)
    y = (lambda c: c["accuracy"]) if have_acc else (lambda c: c["ratio_target"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for codec, mk in zip(("fp32", "fp16", "bf16", "int8"), "osD^", strict=True):
        pts = [c for c in cs if c["codec"] == codec and (y(c) is not None)]
        if pts:
            ax.scatter([c["predicted_ms"] for c in pts], [y(c) for c in pts], marker=mk, alpha=0.6,
                       label=codec, c=[c["nodes"] for c in pts], cmap="viridis", vmin=1, vmax=4)
    front = sorted([c for c in cs if c["pareto"] and y(c) is not None], key=lambda c: c["predicted_ms"])
    if front:
        ax.plot([c["predicted_ms"] for c in front], [y(c) for c in front], "k--", lw=1, label="Pareto front")
    r = res["recommended"]
    if r is not None and y(r) is not None:
        ax.scatter([r["predicted_ms"]], [y(r)], s=250, facecolors="none", edgecolors="red", label="recommended")
    ax.axvline(res["single_process"]["ms"], color="gray", lw=1, ls=":", label="one process")
    ax.set_xscale("log")
    ax.set_xlabel("predicted latency per inference (ms)")
    ax.set_ylabel("accuracy" if have_acc else "communication ratio r")
    bw = res["bandwidth_bps"]
    ax.set_title(f"{res['model']} {'x'.join(map(str, res['input_shape']))}, "
                 f"{'unshaped' if bw is None else f'{bw / 1e6:g} Mbit/s'}, {res['latency_s'] * 1e3:g} ms "
                 "(colour: N)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
