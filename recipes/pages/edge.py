"""The device engine side by side (bench/edge.py -> results/edge.json; its --pingpong -> results/pingpong.json):
per model, one process against N nodes on each engine, memory and latency, and issue 30's targets stated from
the data (a target whose rows are missing says so)."""

from __future__ import annotations

from pathlib import Path

from .md import md_table, opt

EDGE, PINGPONG, ARCHITECTURES, FLOOR = "edge", "pingpong", "architectures", "edge_floor"
BANDWIDTHS = ("none", "1gbit", "100mbit", "10mbit")
ENGINE_NAME = {"torch": "torch", "onnx": "ONNX Runtime", "onnxruntime": "ONNX Runtime"}
COLUMNS = ["run", "engine", "processes", "peak RSS per process (MB)", "weights per node (MB)",
           "torch in node", "unshaped (ms)", "1 Gbit/s (ms)", "100 Mbit/s (ms)", "10 Mbit/s (ms)", "messages",
           "KB sent", "error"]


def _setting(e: dict) -> str:
    if e["what"] == "single":
        return "dense, one process" + {"basic": " (the nodes' session settings, basic level)",
                                       "default": " (ONNX Runtime's defaults)"}.get(e.get("sessions"), "")
    split = "dense split" if e["target_ratio"] >= 1 else f"r={e['target_ratio']:g} {e['budget']}"
    return (f"N={e['nodes']} {split}" + (f", {e['codec']}" if e.get("codec", "fp32") != "fp32" else "")
            + (", input at every node" if e.get("input_at", "leader") != "leader" else "")
            + (f", the trained split `{Path(e['checkpoint']).parent.name}/{Path(e['checkpoint']).name}`"
               if e.get("checkpoint") else ""))


def _rows(entries: list[dict], model: str) -> list[list[object]]:
    """One row per (setting, engine); the bandwidths of a split are columns."""
    groups: dict[tuple, dict[str, dict]] = {}
    for e in entries:
        if e["model"] == model:
            groups.setdefault((_setting(e), ENGINE_NAME[e["engine"]]), {})[e.get("bandwidth") or "none"] = e
    rows = []
    for (setting, engine), by_bw in groups.items():
        first = by_bw.get("none") or next(iter(by_bw.values()))
        rss = first.get("peak_rss_mb_per_node") or ([first["peak_rss_mb"]] if "peak_rss_mb" in first else None)
        weights = first.get("weight_bytes_per_node")
        torch_in = first.get("torch_in_node", first.get("torch_in_process"))
        errors = sorted({e["error"][:80] for e in by_bw.values() if e.get("error")})
        rows.append([setting, engine, len(rss) if rss else 1, opt(max(rss) if rss else None, "{:.0f}"),
                     opt(max(weights) / 2**20 if weights else None, "{:.2f}"),
                     "-" if torch_in is None else ("yes" if (any(torch_in) if isinstance(torch_in, list)
                                                             else torch_in) else "no"),
                     *[opt(by_bw[b].get("latency_ms_median") if b in by_bw else None, "{:.1f}") for b in BANDWIDTHS],
                     opt(first.get("messages_per_inference"), "{}"),
                     opt(first["bytes_sent_total"] / 1000 if first.get("bytes_sent_total") is not None else None,
                         "{:.1f}"), "; ".join(errors) or ""])
    return rows


def _find(entries: list[dict], model: str, engine: str, what: str = "split", nodes: int | None = None,
          ratio: float | None = None, budget: str | None = None, bandwidth: str = "none", codec: str = "fp32",
          input_at: str = "leader") -> dict | None:
    for e in entries:
        if (e["model"], ENGINE_NAME[e["engine"]], e["what"]) != (model, ENGINE_NAME[engine], what) or e.get("error"):
            continue
        if what == "single" or (e["nodes"], e["target_ratio"], e["budget"], e["bandwidth"], e.get("codec", "fp32"),
                                e.get("input_at", "leader")) == (nodes, ratio, budget, bandwidth, codec, input_at):
            return e
    return None


def _best_single_ort(entries: list[dict], model: str, field: str) -> float | None:
    """The lowest ``field`` of the model's one-process ONNX Runtime rows (each session setting measured): the
    split is held against the best the whole model does in one process."""
    vals = [e[field] for e in entries if (e["model"], ENGINE_NAME[e["engine"]], e["what"]) == (
        model, "ONNX Runtime", "single") and not e.get("error") and e.get(field) is not None]
    return min(vals) if vals else None


def _verdict(ok: bool | None, text: str) -> str:
    return f"- {text}: **{'not measured yet' if ok is None else ('met' if ok else 'not met')}**"


def _floor(floors: list[dict] | None, model: str, ratio: float, budget: str, codec: str = "fp32") -> dict | None:
    """bench/floor.py's entry for a split (None where it was not measured)."""
    return next((f for f in floors or [] if (f["model"], f["nodes"], f["target_ratio"], f["budget"], f["codec"]) == (
        model, 2, ratio, budget, codec)), None)


def _speed(entries: list[dict], floors: list[dict] | None, m: str, where: str) -> list[str]:
    """The two speed targets with the input sent by rank 0 (``leader``, as the issue measured) or read by every
    node (``every-node``: no input message), each with its floor where bench/floor.py measured it."""
    out = []
    tag = "" if where == "leader" else " (input at every node)"
    floor_key = "floor_ms" if where == "leader" else "floor_ms_every_node"
    fast = _find(entries, m, "onnx", nodes=2, ratio=0.2, budget="global", bandwidth="1gbit", codec="fp16",
                 input_at=where)
    fast_torch = _find(entries, m, "torch", nodes=2, ratio=0.2, budget="global", bandwidth="1gbit", codec="fp16",
                       input_at=where)
    one_ms = _best_single_ort(entries, m, "latency_ms_median")
    if fast and one_ms and fast_torch:
        a, b, c = fast["latency_ms_median"], one_ms, fast_torch["latency_ms_median"]
        out.append(_verdict(a <= 0.8 * b, f"fp16 at 1 Gbit/s{tag}, ONNX engine <= 0.8x one ONNX Runtime process "
                                          f"({a:.1f} ms against {b:.1f}: {a / b:.2f}x)"))
        out.append(_verdict(a <= 0.6 * c, f"... and <= 0.6x the torch engine ({a:.1f} ms against {c:.1f}: "
                                          f"{a / c:.2f}x)"))
        f = _floor(floors, m, 0.2, "global", "fp16")
        if f and floor_key in f:
            lo = f[floor_key]["1gbit"]
            out.append(f"  - floor: this split's schedule on this host at 1 Gbit/s{tag}, no cost per message and "
                       f"every overlap it allows, {lo:.1f} ms ({lo / b:.2f}x one process; bench/floor.py)")
    elif where == "leader":
        out.append(_verdict(None, "fp16 at 1 Gbit/s, ONNX engine <= 0.8x one ONNX Runtime process and <= 0.6x "
                                  "the torch engine"))
    dense = _find(entries, m, "onnx", nodes=2, ratio=1.0, budget="global", bandwidth="100mbit", input_at=where)
    sparse = _find(entries, m, "onnx", nodes=2, ratio=0.2, budget="global", bandwidth="100mbit", input_at=where)
    if dense and sparse:
        x = dense["latency_ms_median"] / sparse["latency_ms_median"]
        out.append(_verdict(x >= 4.7, f"100 Mbit/s{tag}, ONNX engine: dense split / DISCO r=0.2 = {x:.2f}x "
                                      "(>= 4.7x)"))
        fd, fs = _floor(floors, m, 1.0, "global"), _floor(floors, m, 0.2, "global")
        if fd and fs and floor_key in fd and floor_key in fs:
            d, s_ = fd[floor_key]["100mbit"], fs[floor_key]["100mbit"]
            out.append(f"  - floor: the two schedules at their floors ({d:.0f} and {s_:.0f} ms) give {d / s_:.2f}x "
                       "(bench/floor.py)")
    elif where == "leader":
        out.append(_verdict(None, "100 Mbit/s, ONNX engine: dense split / DISCO r=0.2 >= 4.7x"))
    return out


def targets(entries: list[dict], pingpong: dict | None, architectures: list[dict] | None = None,
            floors: list[dict] | None = None) -> list[str]:
    """Issue 30's memory, speed and transport targets from the data, for resnet50 (the issue's model); with
    bench/floor.py's results, what the split itself allows on this host beside each target it bounds."""
    m = "resnet50"
    onnx = _find(entries, m, "onnx", nodes=2, ratio=0.2, budget="global")
    tor = _find(entries, m, "torch", nodes=2, ratio=0.2, budget="global")
    joint = _find(entries, m, "onnx", nodes=2, ratio=0.2, budget="joint")
    one_ort = _best_single_ort(entries, m, "peak_rss_mb")
    out = []
    if onnx:
        rss, w = max(onnx["peak_rss_mb_per_node"]), max(onnx["weight_bytes_per_node"]) / 2**20
        out.append(_verdict(rss <= w + 80, f"resnet50 N=2 r=0.2 ONNX engine, peak RSS per node <= weights per node "
                                           f"+ 80 MB ({rss:.0f} MB against {w:.0f} + 80)"))
    else:
        out.append(_verdict(None, "resnet50 N=2 r=0.2 ONNX engine, peak RSS per node <= weights per node + 80 MB"))
    if onnx and tor:
        a, b = max(onnx["peak_rss_mb_per_node"]), max(tor["peak_rss_mb_per_node"])
        out.append(_verdict(a <= 0.2 * b, f"... and <= 0.2x the torch engine's node ({a:.0f} MB against {b:.0f}: "
                                          f"{a / b:.3f}x)"))
    if joint and one_ort:
        a, b = max(joint["peak_rss_mb_per_node"]), one_ort
        out.append(_verdict(a <= 0.5 * b, f"joint budget: ONNX node <= 0.5x one ONNX Runtime process of the dense "
                                          f"model ({a:.0f} MB against {b:.0f}: {a / b:.3f}x)"))
        if f := _floor(floors, m, 0.2, "joint"):
            lo = min(r["rss_loaded_mb"] for r in f["ranks"])
            out.append(f"  - floor: a joint node holds {lo:.0f} MB ({lo / b:.3f}x) once its graphs are loaded, before "
                       "any inference (bench/floor.py)")
    for where in ("leader", "every-node"):
        out += _speed(entries, floors, m, where)
    splits = [a for a in architectures or [] if a.get("ok")]
    tried = [a for a in splits if a.get("onnx_ok") is not None]
    good, refused = sum(a["onnx_ok"] for a in tried), sum(a.get("onnx_exit_code") == 2 for a in tried)
    out.append(_verdict(None if not tried or len(tried) < len(splits) else good == len(splits),
                        "exact: every model of results/architectures.json that splits also runs on the ONNX engine "
                        f"within 1e-4 with bytes sent = predicted ({good} of {len(splits)}; {len(tried)} tried, "
                        f"{refused} refused by the ONNX export: see docs/architectures.md)"))
    zmq = next((r for r in (pingpong or {}).get("rows", []) if r["transport"] == "zmq" and r["bytes"] == 1024), None)
    out.append(_verdict(None if zmq is None else zmq["one_way_ms"] <= 0.1,
                        "transport one way, 1 KB, loopback <= 0.1 ms"
                        + ("" if zmq is None else f" ({zmq['one_way_ms']:.3f} ms)")))
    return out


def page_section(data: dict) -> str:
    """docs/edge.md's generated section: per model the table, then the targets."""
    entries = data.get(EDGE) or []
    parts = []
    for model in dict.fromkeys(e["model"] for e in entries):
        parts += [f"**{model}**", "", md_table(_rows(entries, model), COLUMNS), ""]
    parts += ["Targets (issue 30; every ratio from one run on one host):", "",
              *targets(entries, data.get(PINGPONG), data.get(ARCHITECTURES), data.get(FLOOR))]
    return "\n".join(parts)


def headline(data: dict) -> str:
    """The README's line: a node's memory on each engine against one process (resnet50, the issue's model, where
    it was measured)."""
    entries = data.get(EDGE) or []
    for model in sorted(dict.fromkeys(e["model"] for e in entries), key=lambda m: m != "resnet50"):
        onnx = _find(entries, model, "onnx", nodes=2, ratio=0.2, budget="global")
        tor = _find(entries, model, "torch", nodes=2, ratio=0.2, budget="global")
        one = _find(entries, model, "torch", "single")
        if onnx and tor and one:
            return (f"{model}, N=2 r=0.2: each node's peak memory is {max(onnx['peak_rss_mb_per_node']):.0f} MB on "
                    f"the ONNX Runtime engine against {max(tor['peak_rss_mb_per_node']):.0f} MB on the torch engine "
                    f"and {one['peak_rss_mb']:.0f} MB for one torch process running the whole model "
                    "(bench/edge.py, [docs/edge.md](docs/edge.md)).")
    return "No run of bench/edge.py yet (results/edge.json)."
