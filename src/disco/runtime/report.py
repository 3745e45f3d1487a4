"""Timing and the report of a run: the timed inferences and the stream on every rank, each node's own
figures (peak memory of its process, bytes, messages) and the leader's JSON report."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..procstat import peak_rss_mb, rss_mb, torch_loaded
from . import hooks
from .options import RunOptions

ENGINE = "torch"
COUNTERS = ("payload_bytes", "overhead_bytes", "other_bytes", "stats_bytes", "messages")


def _stream(opts: RunOptions, ex: Any, tr: Any, inputs: list[Any] | None, rank: int) -> tuple[float, list[float]]:
    """``opts.iters`` inferences with ``opts.stream`` in flight: the seconds, and this node's RSS (MB)
    sampled about 40 times along the stream."""
    rss: list[float] = []
    tr.flush()
    every = max(1, opts.iters // 40)
    t0 = time.perf_counter()
    futs: list[Any] = []
    for i in range(opts.iters):
        hooks.fire("stream", rank=rank, i=i)
        futs.append((ex.start(inputs, flush=rank != 0), tr.mark()))
        if len(futs) > opts.stream:
            finish, mark = futs.pop(0)
            finish()  # its output is back: every send of that inference was received
            tr.settle(mark)
        if i % every == 0:
            rss.append(round(rss_mb(), 2))
    for finish, _ in futs:
        finish()
    tr.flush()
    stream_s = time.perf_counter() - t0
    rss.append(round(rss_mb(), 2))
    return stream_s, rss


def timed(opts: RunOptions, ex: Any, tr: Any, inputs: list[Any] | None, rank: int
          ) -> tuple[list[float], Any, dict[str, int], float | None, list[float]]:
    """Warm-up and timed inferences, then the stream: latencies, first output, per-inference counters,
    the stream's seconds and this node's RSS (MB) sampled along the stream."""
    lat: list[float] = []
    first = None
    per_inf: dict[str, int] = {}
    for k in range(opts.warmup + opts.iters):
        hooks.fire("inference", rank=rank, k=k)
        t0 = time.perf_counter()
        out = ex.run(inputs)
        lat.append(time.perf_counter() - t0)
        if k == 0:
            first = out
            per_inf = tr.counters()
    stream_s, rss = _stream(opts, ex, tr, inputs, rank) if opts.stream > 0 else (None, [])
    return lat, first, per_inf, stream_s, rss


def node_stats(rank: int, per_inf: dict[str, int], rss_stream: list[float], weight_bytes: int,
               params: int) -> dict[str, Any]:
    """This node's figures for the leader's report, measured in this process at its end."""
    return {"rank": rank, "peak_rss_mb": round(peak_rss_mb(), 2), "torch_in_node": torch_loaded(),
            "rss_mb_stream": rss_stream, "weight_bytes": weight_bytes, "params": params,
            **{k: per_inf.get(k, 0) for k in COUNTERS}}


def build_report(opts: RunOptions, man: dict[str, Any], codec: Any, link: Any, lat: list[float], first: Any,
                 ref: dict[str, Any] | None, stream_s: float | None, all_stats: list[dict[str, Any]],
                 extra: dict[str, Any]) -> dict[str, Any]:
    """The leader's report (``disco run --json``) from every node's :func:`node_stats`."""
    from .proof import run_error

    timed_s = lat[opts.warmup:] or lat

    def total(k: str) -> int:
        return int(sum(s.get(k, 0) for s in all_stats))

    return {
        "engine": ENGINE, "nodes": len(all_stats), "model": man["model"]["name"], "input_shape": man["input_shape"],
        "codec": codec.name, "ratio": man["ratio"], "input_at": opts.input_at,
        "bandwidth_mbit": None if link.bandwidth_bps is None else link.bandwidth_bps / 1e6,
        "latency_s": link.latency_s, "shaping": "pacing" if link.shaped else None,
        "latency_ms_median": float(np.median(timed_s) * 1e3), "latency_ms_all": [t * 1e3 for t in timed_s],
        "throughput_per_s": (opts.iters / stream_s) if stream_s else float(1.0 / np.median(timed_s)),
        "stream": opts.stream,
        "bytes_sent_total": total("payload_bytes"),
        "bytes_predicted": int(man["bytes_predicted"] // 4 * codec.bytes_per_value),
        "bytes_codec_overhead": total("overhead_bytes"), "bytes_input_output": total("other_bytes"),
        "bytes_stats": total("stats_bytes"), "bytes_stats_predicted": int(man.get("stats_bytes", 0)),
        "max_rel_err_vs_single_process": None if ref is None else run_error(first, ref, man),
        "proof": man.get("proof"),
        "peak_rss_mb_per_node": [s["peak_rss_mb"] for s in all_stats],
        "torch_in_node": [s["torch_in_node"] for s in all_stats],
        "rss_mb_stream_per_node": [s["rss_mb_stream"] for s in all_stats],
        "weight_bytes_per_node": [s["weight_bytes"] for s in all_stats],
        "params_per_node": [s["params"] for s in all_stats], "params_dense": man["params_dense"],
        "messages_per_inference": total("messages"),
        **extra,
    }
