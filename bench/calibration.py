"""The latency model's calibration: per-message delays, the per-message overhead on unshaped links, the
per-node compute traces (kept beside the exports), and recomputing every prediction from them."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from disco.runtime import latency as lat
from disco.runtime.transport import LinkModel

LOAD_S = 0.002  # seconds of compute between messages in the loaded ping-pong calibration
TCP_GOODPUT = 1448 / 1514  # TCP payload per Ethernet frame (MTU 1500, timestamps on)
EXPORTS = Path(tempfile.gettempdir()) / "disco-bench-exports"
TRACES: dict[str, list] = {}  # "model|N|r|codec" -> per-node programs (kept beside the exports)


def delays(meta: dict[str, Any]) -> dict[str, lat.Delay]:
    """Per shaping: the fitted per-message delay (``meta.delay_model``: ping-pong on idle cores, or
    'loaded': both ends computing between messages, as the executor does); the paced one goes
    through the pacing thread."""
    suffix = "_loaded" if meta.get("delay_model", "loaded") == "loaded" else ""
    d = meta.get("delay" + suffix, meta["delay"])
    p = meta.get("delay" + suffix + "_paced", d)
    d, p = lat.Delay(d["a_s"], d["b_s_per_byte"]), lat.Delay(p["a_s"], p["b_s_per_byte"])
    return {"none": d, "tc": d, "pacing": p}


def load_traces() -> None:
    f = EXPORTS / "traces.json"
    if f.is_file():
        TRACES.update({k: [[tuple(s) for s in p] for p in v] for k, v in json.loads(f.read_text()).items()})


def save_traces() -> None:
    EXPORTS.mkdir(parents=True, exist_ok=True)
    (EXPORTS / "traces.json").write_text(json.dumps(TRACES))


def calibrate_overhead(data: dict[str, Any], delay: dict[str, lat.Delay], cores: int) -> float:
    """Per-message runtime overhead o (s) on unshaped links: the value for which the model reproduces
    one unshaped loopback run (resnet50, dense, N=2, fp32; else the first dense N=2 fp32 loopback run)."""
    cands = [e for e in data["entries"] if e["mode"] == "dense" and e["nodes"] == 2 and e.get("codec") == "fp32"
             and e["bandwidth_mbit"] is None and e.get("latency_ms_median")]
    cands.sort(key=lambda e: e["model"] != "resnet50")
    for e in data["entries"]:
        e.pop("calibration", None)
    if not cands:
        return 0.0
    e = cands[0]
    progs = TRACES.get(f"{e['model']}|2|1|fp32")
    if progs is None:
        return 0.0
    target = e["latency_ms_median"] / 1e3
    lo, hi = 0.0, 0.01
    if lat.replay(progs, LinkModel(None), cores, delay["none"]) >= target:
        o = 0.0
    else:
        for _ in range(30):
            mid = (lo + hi) / 2
            if lat.replay(lat.with_overhead(progs, mid), LinkModel(None), cores, delay["none"]) < target:
                lo = mid
            else:
                hi = mid
        o = (lo + hi) / 2
    e["calibration"] = True
    data["meta"]["msg_overhead_s"] = o
    data["meta"]["msg_overhead_from"] = f"{e['model']} dense N=2 fp32 unshaped loopback, measured " \
        f"{e['latency_ms_median']:.1f} ms over {e.get('messages')} messages"
    return o


def repredict(out: Path, delay_model: str | None = None) -> None:
    """Recompute every prediction from the stored traces and calibration (after a change of the model)."""
    load_traces()
    data = json.loads(out.read_text())
    if delay_model:
        data["meta"]["delay_model"] = delay_model
    delay = delays(data["meta"])
    cores = data["meta"].get("host_cpus") or os.cpu_count()
    o = calibrate_overhead(data, delay, cores)
    for e in data["entries"]:
        if e["mode"] == "single":
            continue
        r = 1.0 if e["nodes"] == 1 else e["ratio_target"]
        progs = TRACES.get(f"{e['model']}|{e['nodes']}|{r:g}|{e['codec']}")
        if progs is None:
            continue
        bw = None if e["bandwidth_mbit"] is None else e["bandwidth_mbit"] * 1e6
        if bw is not None and e.get("shaping") == "tc":
            bw *= TCP_GOODPUT
        pred = lat.predict(progs, LinkModel(bw), cores, delay[e.get("shaping") or "none"],
                           o if e["bandwidth_mbit"] is None and e["nodes"] > 1 else 0.0)
        e["predicted_ms"] = round(pred["predicted_ms"], 3)
        e["predicted_ms_no_overlap"] = round(pred["predicted_ms_no_overlap"], 3)
        if e.get("latency_ms_median"):
            e["measured_over_predicted"] = round(e["latency_ms_median"] / pred["predicted_ms"], 3)
    out.write_text(json.dumps(data, indent=1))
