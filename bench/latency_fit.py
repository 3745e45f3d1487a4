"""Fit the planner's latency model on results/latency.json and check it on held-out entries.

    OMP_NUM_THREADS=1 .venv/bin/python bench/latency_fit.py            # features (cached) + fit + report
    .venv/bin/python bench/latency_fit.py --report                      # the report from the stored fit only

For every measured entry of results/latency.json the script rebuilds the entry's kept set (the
benchmark's: random init, seed 0, one-shot global magnitude selection; the CIFAR entries that
used a trained checkpoint get the magnitude set at the same r instead, and say so) and the node
programs of :func:`disco.planner.programs` (compute segments as FLOPs / ops / messages / bytes).

Two fits, on a calibration subset (every other entry in key order; the rest is held out):

1. **compute**: each node's measured compute (``compute_ms_per_node``: its plan alone, 1 thread,
   no communication) = flop_s * FLOPs + op_s * ops + msg_s * messages + byte_s * bytes.
2. **link**: with each node's compute rescaled to what was measured, ``simulate`` (2 cores shared
   by the node processes, as on the benchmark host) with a per-message delay a + b*S and a CPU
   overhead after every received message o + o_b*S, separately for unshaped and paced links;
   a grid search minimises the largest |log(measured / predicted)| of the calibration subset.

Writes results/latency_model.json: the calibration, and per entry measured, the old prediction,
the new one with measured compute (the link model alone) and the planner's (compute model too).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from disco import planner  # noqa: E402
from disco.runtime import latency as lat  # noqa: E402
from disco.runtime.transport import LinkModel  # noqa: E402

SRC = ROOT / "results" / "latency.json"
OUT = ROOT / "results" / "latency_model.json"
CACHE = Path(os.environ.get("TMPDIR", "/tmp")) / "disco-latency-fit-features.json"
TCP_GOODPUT = 1448 / 1514
CORES = 2  # the benchmark host's cores (meta.host_cpus)


def key(e: dict) -> str:
    return f"{e['model']}|{e['nodes']}|{e.get('ratio_target')}|{e['codec']}|{e['bandwidth_mbit']}|{e['shaping']}"


def entries() -> tuple[dict, list[dict], list[dict]]:
    d = json.loads(SRC.read_text())
    multi = [e for e in d["entries"] if e.get("latency_ms_median") is not None and e["nodes"] > 1
             and e.get("compute_ms_per_node")]
    single = [e for e in d["entries"] if e["mode"] == "single" and e.get("latency_ms_median") is not None]
    return d["meta"], sorted(multi, key=key), single


def build_features(multi: list[dict], models: list[str]) -> dict[str, dict]:
    """Programs (feature segments) per (model, N, r, codec), cached on disk."""
    import torch

    from disco.graph import partition
    from disco.masks import DiscoModel
    from disco.models import build_model
    from disco.sparsify import magnitude_scores, select_links

    cache = json.loads(CACHE.read_text()) if CACHE.is_file() else {}
    need: dict[tuple[str, int], set] = {}
    for e in multi:
        if e["model"] in models:
            k = f"{e['model']}|{e['nodes']}|{e['ratio_target']}|{e['codec']}"
            if k not in cache:
                need.setdefault((e["model"], e["nodes"]), set()).add((e["ratio_target"], e["codec"]))
    for (name, n), todo in sorted(need.items()):
        t0 = time.perf_counter()
        shape = tuple(next(e["input_shape"] for e in multi if e["model"] == name))
        torch.manual_seed(0)
        model = build_model(name)
        x = torch.randn(shape)
        part = partition(model, x, n)
        scores = magnitude_scores(DiscoModel(model, part))
        for r, codec in sorted(todo):
            kept = part.all_links() if r >= 1 else select_links(part, scores, r, "global")
            progs = planner.programs(part, kept, codec)
            cache[f"{name}|{n}|{r}|{codec}"] = {
                "progs": [[[s[0], *(s[1].tolist() if s[0] == "c" else s[1:])] for s in p] for p in progs],
                "ratio": part.ratio(kept)}
        CACHE.write_text(json.dumps(cache))
        print(f"features {name} N={n}: {len(todo)} settings in {time.perf_counter() - t0:.0f} s", flush=True)
    for v in cache.values():
        if isinstance(v["progs"][0][0], list):
            v["progs"] = [[("c", np.array(s[1:])) if s[0] == "c" else tuple(s) for s in p] for p in v["progs"]]
    return cache


def fit_compute(multi: list[dict], feats: dict) -> tuple[np.ndarray, list]:
    """Non-negative relative least squares of per-node compute on [FLOPs, ops, msgs, bytes]."""
    X, y = [], []
    for e in multi:
        f = feats.get(f"{e['model']}|{e['nodes']}|{e['ratio_target']}|{e['codec']}")
        if f is None:
            continue
        F = planner.features(f["progs"])
        for j, ms in enumerate(e["compute_ms_per_node"]):
            X.append(F[j])
            y.append(ms / 1e3)
    X, y = np.array(X), np.array(y)
    w = 1 / y
    active = list(range(4))
    while True:
        coef, *_ = np.linalg.lstsq(X[:, active] * w[:, None], y * w, rcond=None)
        if (coef >= 0).all():
            break
        active.pop(int(np.argmin(coef)))
    full = np.zeros(4)
    full[active] = coef
    pred = X @ full
    return full, [float(np.max(np.abs(np.log(pred / y)))), float(np.median(np.abs(np.log(pred / y))))]


def predict_entry(e: dict, feats: dict, cal: planner.Calibration, measured_compute: bool) -> float:
    f = feats[f"{e['model']}|{e['nodes']}|{e['ratio_target']}|{e['codec']}"]
    progs = planner.price(f["progs"], cal, compute_ms=e["compute_ms_per_node"] if measured_compute else None)
    bw = None if e["bandwidth_mbit"] is None else e["bandwidth_mbit"] * 1e6
    if bw is not None and e["shaping"] == "tc":
        bw *= TCP_GOODPUT
    link = LinkModel(bw, 0.0)
    if e["shaping"] == "pacing":
        progs = planner.with_overheads(progs, cal.overhead_paced_s, cal.overhead_paced_byte_s)
    else:  # unshaped and tc: no pacing thread
        progs = planner.with_overheads(progs, cal.overhead_unshaped_s, cal.overhead_unshaped_byte_s)
    return lat.simulate(progs, link, CORES, cal.delay(e["shaping"] == "pacing")) * 1e3


def err(es: list[dict], feats: dict, cal: planner.Calibration, measured_compute: bool) -> np.ndarray:
    return np.array([math.log(e["latency_ms_median"] / predict_entry(e, feats, cal, measured_compute)) for e in es])


def fit_link(calib: list[dict], feats: dict, cal: planner.Calibration, meta: dict) -> planner.Calibration:
    """Grid search, for unpaced (unshaped loopback and tc) and paced links apart, of the per-message
    delivery delay ``a`` (the per-byte ``b`` stays the loaded ping-pong's, ``meta.delay_loaded*``) and
    the CPU overhead after each received message ``o + o_b*S``, on the calibration subset."""
    d, dp = meta["delay_loaded"], meta["delay_loaded_paced"]
    base = dict(cal.__dict__, delay_a=d["a_s"], delay_b=d["b_s_per_byte"], delay_paced_a=dp["a_s"],
                delay_paced_b=dp["b_s_per_byte"])
    grid = list(itertools.product([0.1e-3, 0.2e-3, 0.3e-3, 0.4e-3, 0.5e-3, 0.6e-3, 0.8e-3, 1.0e-3],
                                  [0.0, 0.1e-3, 0.2e-3, 0.3e-3, 0.4e-3, 0.6e-3], [0.0, 0.5e-9, 2e-9]))
    for kind, sel, a_key in (("unshaped", lambda e: e["shaping"] != "pacing", "delay_a"),
                             ("paced", lambda e: e["shaping"] == "pacing", "delay_paced_a")):
        es = [e for e in calib if sel(e)]
        scores = []
        for a, o, ob in grid:
            c = planner.Calibration(**(base | {a_key: a, f"overhead_{kind}_s": o, f"overhead_{kind}_byte_s": ob}))
            le = err(es, feats, c, True)
            scores.append((float(np.max(np.abs(le))), float(np.mean(le ** 2)), a, o, ob))
        best = min(scores)
        base |= {a_key: best[2], f"overhead_{kind}_s": best[3], f"overhead_{kind}_byte_s": best[4]}
        print(f"{kind}: delay a = {best[2] * 1e6:.0f} us, o = {best[3] * 1e6:.0f} us + {best[4] * 1e9:.2f} ns/B, "
              f"worst |log| {best[0]:.3f} over {len(es)} calibration entries", flush=True)
    return planner.Calibration(**base)


def summary(es: list[dict], preds: list[float]) -> dict:
    r = np.array([e["latency_ms_median"] / p for e, p in zip(es, preds, strict=True)])
    return {"n": len(es), "within_1.25x": int(((r >= 0.8) & (r <= 1.25)).sum()),
            "worst_ratio": float(r[np.argmax(np.abs(np.log(r)))]) if len(r) else None,
            "median_abs_log": float(np.median(np.abs(np.log(r)))) if len(r) else None}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet50,cifar_resnet20,deit_small_patch16_224,rrdbnet,"
                                        "deeplabv3plus_resnet50,ssd300_vgg16_split")
    ap.add_argument("--report", action="store_true")
    args = ap.parse_args()
    if args.report:
        print(json.dumps(json.loads(OUT.read_text())["summary"], indent=1))
        return 0
    import torch

    torch.set_num_threads(1)
    meta, multi, single = entries()
    models = args.models.split(",")
    feats = build_features(multi, models)
    multi = [e for e in multi if f"{e['model']}|{e['nodes']}|{e['ratio_target']}|{e['codec']}" in feats]
    calib, held = multi[0::2], multi[1::2]
    coef, cfit = fit_compute(calib, feats)
    cal = planner.Calibration(flop_s=coef[0], op_s=coef[1], msg_s=coef[2], byte_s=coef[3])
    cal = fit_link(calib, feats, cal, meta)
    cal.single_process = {f"{e['model']}|{','.join(map(str, e['input_shape']))}": round(e["latency_ms_median"], 3)
                          for e in single}
    rows = []
    for e in multi:
        rows.append({"key": key(e), "calibration": e in calib, "measured_ms": e["latency_ms_median"],
                     "old_predicted_ms": e["predicted_ms"],
                     "link_model_ms": round(predict_entry(e, feats, cal, True), 3),
                     "planner_ms": round(predict_entry(e, feats, cal, False), 3),
                     "weights": e.get("weights"), "loadavg_1min": e.get("loadavg_1min"),
                     "kept_set": "reproduced" if (e.get("weights") or "").startswith("random") else
                     "magnitude at the same r (the entry used a trained checkpoint not in the repository)"})
    out = {"calibration": {k: v for k, v in cal.__dict__.items() if k != "source"},
           "compute_fit_log_error_calibration": {"worst": cfit[0], "median": cfit[1]},
           "method": __doc__.strip(),
           "summary": {
               "old model, all measured": summary(multi, [e["predicted_ms"] for e in multi]),
               "link model (measured compute), calibration": summary(calib, [predict_entry(e, feats, cal, True)
                                                                            for e in calib]),
               "link model (measured compute), held out": summary(held, [predict_entry(e, feats, cal, True)
                                                                        for e in held]),
               "planner (compute model too), calibration": summary(calib, [predict_entry(e, feats, cal, False)
                                                                          for e in calib]),
               "planner (compute model too), held out": summary(held, [predict_entry(e, feats, cal, False)
                                                                      for e in held]),
           },
           "entries": rows}
    OUT.write_text(json.dumps(out, indent=1))
    print(json.dumps(out["summary"], indent=1))
    print(json.dumps(out["calibration"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
