"""The search: every candidate (N, shares, r, codec) priced, the Pareto front, the recommended point."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..checkpoint import is_checkpoint
from ..runtime.transport import get_codec
from .accuracy import accuracy_for, accuracy_rows, codec_drops
from .calibration import Calibration
from .engines import ENGINES, onnx_calibration, require_onnx_engine
from .host import scaled_to_host, single_process
from .pricing import predict_ms, price
from .programs import programs


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
    engine: str = "torch"  # the node engine priced: torch (as calibrated) or onnx (measured here, see .engines)
    input_at: str = "leader"  # leader: rank 0 sends the input; every-node: each node reads it (no input message)


def _prepare(req: PlanRequest) -> tuple[Any, str, dict[str, Any]]:
    """(the plain model, its name, checkpoint facts or {})."""
    import torch

    from ..models import build_model

    p = Path(req.model)
    if is_checkpoint(req.model):
        from ..loading import load

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


def plan(req: PlanRequest, cal: Calibration | None = None, results: Iterable[tuple[str, Any]] = (),
         codecs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every candidate with its predictions, the Pareto front and the recommended point.

    ``cal``: the latency model (default: the package's fit); ``results``: (source, loaded results JSON) pairs
    where the accuracy of known (N, r) points is looked up (:func:`accuracy_rows`); ``codecs``: the loaded
    results/codecs.json (each codec's measured worst drop; None: fp32 only is known to lose nothing)."""
    from ..cost import estimate
    from ..graph import partition
    from ..masks import DiscoModel
    from ..sparsify import magnitude_scores, select_links

    cal = cal or Calibration()
    if req.engine not in ENGINES:
        raise ValueError(f"engine {req.engine!r}: expected one of {', '.join(ENGINES)}")
    if req.engine == "onnx":
        require_onnx_engine()  # before the model is built
    model, name, facts = _prepare(req)
    shape = tuple(req.input_shape)
    host = None
    if req.engine == "onnx":  # measured here: --time-host is implied
        cal, host = onnx_calibration(cal, model, name, shape)
    elif req.time_host:
        cal, host = scaled_to_host(cal, model, name, shape)
    codec_drop = codec_drops(codecs)
    acc_rows = accuracy_rows(results, name)
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
                    progs = price(programs(part, kept, codec, req.input_at), cal, speeds, codec=codec)
                    ms = predict_ms(progs, req.bandwidth_bps, req.latency_s, cal, req.cores, speeds)
                    bpv = get_codec(codec).bytes_per_value
                    acc, src = accuracy_for(acc_rows, facts, n, r, shares, codec, codec_drop)
                    cands.append(Candidate(
                        nodes=n, ratio=round(rep.ratio, 4), ratio_target=r, codec=codec,
                        shares=list(shares) if shares else None, predicted_ms=round(ms, 2),
                        bytes=rep.bytes // 4 * bpv, bytes_per_node_sent=[b // 4 * bpv for b in rep.bytes_sent_per_node],
                        params_per_node=rep.params_per_node, weight_bytes_per_node=weights,
                        peak_activation_bytes_per_node=rep.peak_activation_bytes_per_node,
                        memory_bytes_per_node=mem, accuracy=acc, accuracy_source=src,
                        fits_memory=req.max_memory_per_node is None or max(mem) <= req.max_memory_per_node))
            del part, scores
    single = single_process(model, name, shape, cal)
    feasible = [c for c in cands if c.fits_memory]
    for c in pareto_front(feasible):
        c.pareto = True
    rec = recommend(feasible, req, codec_drop)
    return {"model": name, "engine": req.engine, "input_at": req.input_at, "input_shape": list(shape),
            "bandwidth_bps": req.bandwidth_bps,
            "latency_s": req.latency_s,
            "cores": req.cores, "speeds": speeds, "calibration": cal.source, "host": host,
            "checkpoint": facts or None,
            "single_process": single, "codec_worst_drop": codec_drop,
            "candidates": [c.to_json() for c in cands],
            "recommended": None if rec is None else rec.to_json(),
            "why": why(rec, req, single)}


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


def why(rec: Candidate | None, req: PlanRequest, single: dict[str, Any]) -> str:
    if rec is None:
        return "no candidate fits the memory limit and the accuracy rule"
    s = (f"fastest candidate that keeps accuracy: N={rec.nodes}, r={rec.ratio_target:g}, {rec.codec}"
         + (f", shares {','.join(f'{x:g}' for x in rec.shares)}" if rec.shares else "")
         + f": {rec.predicted_ms:.1f} ms predicted")
    if single.get("ms") is not None and single["ms"] < rec.predicted_ms:
        s += (f"; one process would take {single['ms']:.1f} ms ({single['source']}): split for memory "
              "(weights per node) rather than speed on this link")
    return s
