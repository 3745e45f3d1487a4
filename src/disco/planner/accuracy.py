"""What the planner knows of accuracy: rows of (N, r, shares, codec) -> metric, given as data (the command
line reads them from results JSON files; the library reads no file), and each codec's measured worst drop."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

METRICS = ("top1", "miou", "map", "psnr_set14", "psnr_set5")  # the metric a row reports, first found


def accuracy_rows(results: Iterable[tuple[str, Any]], model: str) -> list[dict[str, Any]]:
    """Known (N, r, codec) -> metric for ``model`` from results documents: (source name, loaded JSON) pairs in
    the recipes' format (a list of entries, or a dict with ``entries`` or ``runs``)."""
    rows: list[dict[str, Any]] = []
    for source, d in results:
        entries = d.get("entries", d.get("runs", [])) if isinstance(d, dict) else d
        if not isinstance(entries, list):
            continue
        for e in entries:
            if not isinstance(e, dict) or e.get("model", d.get("model") if isinstance(d, dict) else None) != model:
                continue
            metric = next((k for k in METRICS if k in e), None)
            if metric is None or "nodes" not in e:
                continue
            rows.append({"nodes": e["nodes"], "ratio": e.get("target_ratio", e.get("ratio", 1.0)),
                         "shares": e.get("shares"), "codec": "fp32", "metric": metric, "value": e[metric],
                         "source": source})
    return rows


QUALITY_METRICS = ("top1", "top5", "miou", "pixel_acc", "map", "map50")


def is_quality_metric(key: str) -> bool:
    """A task metric where higher is better and a drop is an accuracy loss (not a count, a timing such as
    detection's ``model_ms``, a per-class IoU or the bicubic baseline of super-resolution)."""
    return key in QUALITY_METRICS or key.startswith("psnr_")


def codec_drops(d: dict[str, Any] | None) -> dict[str, float]:
    """Per codec: the worst metric drop against fp32 over the checkpoints of ``d`` (results/codecs.json's
    content; None: only fp32 is known, at no drop)."""
    if d is None:
        return {"fp32": 0.0}
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


def accuracy_for(rows: list[dict[str, Any]], facts: dict[str, Any], n: int, r: float,
                  shares: tuple[float, ...] | None, codec: str, drop: dict[str, float]
                  ) -> tuple[float | None, str | None]:
    if codec not in drop:
        return None, None
    cands = [x for x in rows if x["nodes"] == n and abs(x["ratio"] - r) < 1e-6
             and (tuple(x["shares"]) if x.get("shares") else None) == shares]
    if facts and facts.get("nodes") == n and abs(facts.get("ratio", 1) - r) < 0.02 and facts.get("metrics"):
        m = facts["metrics"]
        k = next((k for k in METRICS if k in m), None)
        if k:
            cands.append({"value": m[k], "source": f"checkpoint {Path(facts['checkpoint']).name} ({k})"})
    if not cands:
        return None, None
    best = max(cands, key=lambda x: x["value"])
    d = drop.get(codec, 0.0)
    return round(best["value"] - d, 3), best["source"] + (f", minus the worst {codec} drop {d:.2f}" if d else "")
