"""Fit the planner's latency model on results/latency.json, and cross-validate it.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.latency_fit            # features (cached) + fits + report (~32 min)
    python -m recipes.pages                                             # docs/latency-model.md from the fit
    OMP_NUM_THREADS=1 .venv/bin/python -m bench.codec_cost             # int8/bf16 codec costs (a fit keeps the last)

Per measured entry of results/latency.json: its kept set as the sweep made it (CIFAR entries from a trained
checkpoint get the magnitude set at the same r) and :func:`disco.planner.programs`. Compute: each node's measured
compute = flop_s * FLOPs + op_s * ops + msg_s * messages + byte_s * bytes (least squares). Link: with the compute
rescaled to what was measured, ``replay`` on 2 shared cores with a per-message delay a + b*S, a wake-up, a CPU
overhead o + o_b*S per received message and the cores' share (``fit_link``), unshaped and paced apart: most
entries within 1.25x, then the least mean squared log-error. Fitted on every entry (what ``disco plan`` uses;
entries whose host speed moved are checked apart) and on each half of a checkerboard ``split``, each entry also
predicted by the half that did not see it. Writes results/latency_model.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from bench.host import DRIFT
from bench.netns import tbf_burst
from disco import planner
from disco.runtime import latency as lat
from disco.runtime.transport import LinkModel

ROOT = Path(__file__).resolve().parents[1]

SRC = ROOT / "results" / "latency.json"
OUT = ROOT / "results" / "latency_model.json"
CODEC_COST = ROOT / "results" / "codec_cost.json"
CACHE = Path(os.environ.get("TMPDIR", "/tmp")) / "disco-latency-fit-features.json"
TCP_GOODPUT = 1448 / 1514
CORES = 2  # the benchmark host's cores (meta.host_cpus)


def fkey(e: dict) -> str:
    return f"{e['model']}|{e['nodes']}|{e['ratio_target']}|{e['codec']}"


def key(e: dict) -> str:
    return f"{e['model']}|{e['nodes']}|{e.get('ratio_target')}|{e['codec']}|{e['bandwidth_mbit']}|{e['shaping']}"


def entries() -> tuple[dict, list[dict], list[dict]]:
    d = json.loads(SRC.read_text())
    multi = [e for e in d["entries"] if e.get("latency_ms_median") is not None and e["nodes"] > 1
             and e.get("compute_ms_per_node")]
    single = [e for e in d["entries"] if e["mode"] == "single" and e.get("latency_ms_median") is not None]
    return d["meta"], sorted(multi, key=key), single


def build_features(multi: list[dict], models: list[str]) -> dict[str, dict]:
    """Programs (feature segments) per (model, N, r, codec) of the sweep's kept sets, cached on disk."""
    from bench.latency import Prepared  # imported here: bench.latency imports this module

    cache = json.loads(CACHE.read_text()) if CACHE.is_file() else {}
    need: dict[tuple[str, int], set] = {}
    for e in multi:
        if e["model"] in models and fkey(e) not in cache:
            need.setdefault((e["model"], e["nodes"]), set()).add((e["ratio_target"], e["codec"]))
    for (name, n), todo in sorted(need.items()):
        t0, prep = time.perf_counter(), Prepared(name, n)
        for r, codec in sorted(todo):
            kept = prep.kept_at(r)
            progs = planner.programs(prep.part, kept, codec)
            cache[f"{name}|{n}|{r}|{codec}"] = {
                "progs": [[[s[0], *(s[1].tolist() if s[0] == "c" else s[1:])] for s in p] for p in progs],
                "ratio": prep.part.ratio(kept)}
        CACHE.write_text(json.dumps(cache))
        print(f"features {name} N={n}: {len(todo)} settings in {time.perf_counter() - t0:.0f} s", flush=True)
    for v in cache.values():
        if isinstance(v["progs"][0][0], list):
            v["progs"] = [[("c", np.array(s[1:])) if s[0] == "c" else tuple(s) for s in p] for p in v["progs"]]
    return cache


def split(multi: list[dict]) -> tuple[list[dict], list[dict]]:
    """The cross-validation's halves A and B, a checkerboard within each (model, N, link kind) group: an entry
    is in A when the ranks of its ratio, codec and bandwidth within the group add up to an even number, so both
    halves see every group, codec and ratio."""
    def axis(e: dict) -> tuple:
        return (e.get("ratio_target", e.get("r")), str(e.get("codec")), e.get("bandwidth_mbit") or 0)

    groups: dict[tuple, list[dict]] = {}
    for e in multi:
        groups.setdefault((e["model"], e["nodes"], e["shaping"]), []).append(e)
    rank: dict[int, int] = {}
    for es in groups.values():
        for i in range(3):
            values = sorted({axis(e)[i] for e in es}, key=str)
            for e in es:
                rank[id(e)] = rank.get(id(e), 0) + values.index(axis(e)[i])
    return [e for e in multi if rank[id(e)] % 2 == 0], [e for e in multi if rank[id(e)] % 2]


def fit_compute(multi: list[dict], feats: dict) -> tuple[np.ndarray, list]:
    """Non-negative relative least squares of per-node compute on [FLOPs, ops, msgs, bytes]."""
    X, y = [], []
    for e in multi:
        if fkey(e) in feats:  # one row per node
            X += list(planner.features(feats[fkey(e)]["progs"])[:len(e["compute_ms_per_node"])])
            y += [ms / 1e3 for ms in e["compute_ms_per_node"]]
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
    """Predicted ms of entry ``e`` (``measured_compute``: its traced compute, else the compute model's)."""
    return predict_setting(feats[fkey(e)]["progs"], e, cal, e["compute_ms_per_node"] if measured_compute else None)


def predict_setting(progs: list, e: dict, cal: planner.Calibration, compute_ms: list[float] | None = None,
                    cores: int = CORES) -> float:
    """Predicted ms of the planner's programs ``progs`` on ``e``'s link (``codec``, ``bandwidth_mbit``, ``shaping``;
    ``compute_ms``: each node's compute rescaled to it); a tc link lets through its tbf bucket (``tbf_burst``)."""
    progs = planner.price(progs, cal, compute_ms=compute_ms, codec=e["codec"])
    bw = None if e["bandwidth_mbit"] is None else e["bandwidth_mbit"] * 1e6
    if e["shaping"] == "tc":  # kernel shaping (tbf's bucket), no pacing: the unshaped delay, nothing else
        return lat.replay(progs, LinkModel(bw * TCP_GOODPUT, 0.0), cores, cal.delay(False), 0.0, cal.oversub,
                          cal.corun, tbf_burst(e["bandwidth_mbit"]) * TCP_GOODPUT, cal.busy_s) * 1e3
    return planner.predict_ms(progs, bw, 0.0, cal, cores)  # paced or unshaped: what `disco plan` predicts


# the coordinate-descent candidates of each link kind's parameters; descent starts from the previous fit, from
# the coarse grid's best with each of STARTS (parameters the grid does not set; the delay at the ping-pong's) and
# from the RANDOM_KEEP best of RANDOM_DRAWS seeded random points of FINE's grid
FINE = {
    "unshaped": {"delay_a": [0.05e-3, 0.1e-3, 0.15e-3, 0.2e-3, 0.3e-3, 0.4e-3, 0.5e-3, 0.7e-3, 1e-3],
                 "delay_b": [0.0, 0.25e-9, 0.5e-9, 0.75e-9, 1e-9, 1.5e-9, 2e-9, 3e-9, 4e-9],
                 "wake_unshaped_s": [0.0, 0.05e-3, 0.1e-3, 0.2e-3, 0.3e-3, 0.4e-3, 0.6e-3, 0.8e-3],
                 "overhead_unshaped_s": [0.0, 0.025e-3, 0.05e-3, 0.1e-3, 0.2e-3, 0.3e-3, 0.4e-3],
                 "overhead_unshaped_byte_s": [0.0, 0.25e-9, 0.5e-9, 1e-9, 1.5e-9, 2e-9, 3e-9, 4e-9],
                 "oversub": [0.5, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0],
                 "corun": [0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0],
                 "wake_oversub_s": [0.0, 0.1e-3, 0.2e-3, 0.3e-3, 0.5e-3, 0.8e-3, 1.2e-3],
                 "busy_s": [0.0, 0.1e-3, 0.2e-3, 0.3e-3, 0.5e-3, 0.8e-3, 1.2e-3]},
    "paced": {"delay_paced_a": [0.05e-3, 0.1e-3, 0.2e-3, 0.3e-3, 0.4e-3, 0.5e-3, 0.7e-3, 1e-3],
              "delay_paced_b": [0.0, 0.25e-9, 0.5e-9, 1e-9, 1.5e-9, 2e-9, 3e-9],
              "wake_paced_s": [0.0, 0.05e-3, 0.1e-3, 0.2e-3, 0.4e-3, 0.6e-3],
              "overhead_paced_s": [0.0, 0.025e-3, 0.05e-3, 0.1e-3, 0.2e-3, 0.3e-3, 0.4e-3],
              "overhead_paced_byte_s": [0.0, 0.5e-9, 1e-9, 2e-9, 3e-9, 4e-9]},
}
STARTS = {"unshaped": [{"wake_oversub_s": w} for w in (0.0, 0.1e-3, 0.3e-3)], "paced": [{}]}
RANDOM_DRAWS, RANDOM_KEEP = 1500, 3


def random_starts(space: dict[str, list[float]], score: Callable[[dict], tuple[float, float]],
                  draws: int = RANDOM_DRAWS, keep: int = RANDOM_KEEP, seed: int = 0) -> list[dict]:
    """The ``keep`` best of ``draws`` seeded random points of the grid ``space`` (by ``score``, lower is better)."""
    rng = np.random.default_rng(seed)
    pts = [{k: float(v[rng.integers(len(v))]) for k, v in space.items()} for _ in range(draws)]
    scored = sorted(((score(p), i) for i, p in enumerate(pts)))
    return [pts[i] for _, i in scored[:keep]]


def fit_link(calib: list[dict], feats: dict, cal: planner.Calibration, meta: dict,
             hold: dict[str, float] | None = None, warm: bool = True, label: str = "",
             seeds: Sequence[planner.Calibration] = ()) -> planner.Calibration:
    """Fit the link parameters on ``calib``, unshaped (with tc) and paced links apart: a coarse grid with the
    loaded ping-pong's delay (``meta.delay_loaded*``), then coordinate descent over ``FINE`` with the delay free
    (the ping-pong, one message beside a synthetic load, is a noisy estimate of the delay inside a run), its
    per-byte part at most twice the ping-pong's (a steeper slope fitted on small messages would overcharge
    megabyte ones). Descent is path-dependent: it also starts from the previous fit (only when ``warm``: a
    cross-validation fold must not start from a fit that saw the other half) and from ``seeds`` (the halves'
    fits), and keeps the best, so a refit never scores below the fit it replaces. Objective: entries within
    1.25x, then the mean squared log-error. ``hold`` fixes parameters (an ablation: ``--hold corun=1``)."""
    hold = hold or {}
    d, dp = meta["delay_loaded"], meta["delay_loaded_paced"]
    base = dict(cal.__dict__, delay_a=d["a_s"], delay_b=d["b_s_per_byte"], delay_paced_a=dp["a_s"],
                delay_paced_b=dp["b_s_per_byte"]) | hold
    grids = {"unshaped": list(itertools.product([0.2e-3, 0.4e-3, 0.6e-3, 0.8e-3], [0.1e-3, 0.2e-3, 0.3e-3, 0.4e-3],
                                                [0.0, 0.5e-9, 1e-9], [1.0, 0.85, 0.7])),
             "paced": list(itertools.product([0.0, 0.2e-3, 0.4e-3, 0.6e-3], [0.1e-3, 0.2e-3, 0.3e-3, 0.4e-3],
                                             [0.0, 0.5e-9, 1e-9, 2e-9], [None]))}
    for kind, sel in (("unshaped", lambda e: e["shaping"] in (None, "tc")),
                      ("paced", lambda e: e["shaping"] == "pacing")):
        es = [e for e in calib if sel(e)]

        def score(p: dict, es: list[dict] = es, base: dict = base) -> tuple[float, float]:
            c = planner.Calibration(**(base | p))
            le = np.array([math.log(e["latency_ms_median"] / predict_entry(e, feats, c, True)) for e in es])
            return -int((np.abs(le) <= math.log(1.25)).sum()), float(np.mean(le ** 2))

        scores = []
        for w, o, ob, eff in grids[kind]:
            p = {f"wake_{kind}_s": w, f"overhead_{kind}_s": o, f"overhead_{kind}_byte_s": ob}
            if eff is not None:
                p["oversub"] = eff
            scores.append((score(p), sorted(p.items())))
        grid_score, grid_best = min(scores)
        print(f"{label}{kind} grid: {-grid_score[0]} of {len(es)} entries within 1.25x", flush=True)
        bmax = 2 * (d if kind == "unshaped" else dp)["b_s_per_byte"]  # the per-byte delay: at most 2x the ping-pong's
        space = {k: [v for v in vs if k not in ("delay_b", "delay_paced_b") or v <= bmax]
                 for k, vs in FINE[kind].items()}
        best_score, best = None, None
        prev = planner.Calibration()  # the committed fit (disco.planner's defaults): kept unless beaten
        starts = [{k: getattr(prev, k) for k in FINE[kind]} | hold] * warm + \
            [{k: getattr(c, k) for k in FINE[kind]} | hold for c in seeds] + \
            [{k: base[k] for k in FINE[kind]} | s | dict(grid_best) | hold for s in STARTS[kind]] + \
            [p | hold for p in random_starts(space, lambda p: score(p | hold))]
        for cur in starts:  # coordinate descent is path-dependent: a few starts, the best kept
            cur_score = score(cur)
            for _ in range(8):  # coordinate descent until no parameter moves
                moved = False
                for name, values in space.items():
                    for v in [] if name in hold else values:
                        trial = cur | {name: v}
                        sc = score(trial)
                        if sc < cur_score:
                            cur_score, cur, moved = sc, trial, True
                if not moved:
                    break
            if best_score is None or cur_score < best_score:
                best_score, best = cur_score, cur
        base |= best
        print(f"{label}{kind}: {best}, {-best_score[0]} of {len(es)} within 1.25x", flush=True)
    return planner.Calibration(**base)


def fit(es: list[dict], feats: dict, meta: dict, hold: dict[str, float], warm: bool, label: str,
        seeds: Sequence[planner.Calibration] = ()) -> tuple[planner.Calibration, list[float]]:
    """The compute fit, then the link fit, on ``es``: the calibration, the compute fit's [worst, median] |log-error|."""
    coef, cfit = fit_compute(es, feats)
    cal = planner.Calibration(flop_s=coef[0], op_s=coef[1], msg_s=coef[2], byte_s=coef[3])
    return fit_link(es, feats, cal, meta, hold, warm, label, seeds), cfit


def drifted(e: dict) -> bool:
    """Whether the host's speed around the entry's run moved more than ``DRIFT`` from its compute trace's."""
    return (e.get("host_drift") or 1.0) > DRIFT


def summary(es: list[dict], preds: list[float]) -> dict:
    r = np.array([e["latency_ms_median"] / p for e, p in zip(es, preds, strict=True)])
    return {"n": len(es), "within_1.25x": int(((r >= 0.8) & (r <= 1.25)).sum()),
            "worst_ratio": float(r[np.argmax(np.abs(np.log(r)))]) if len(r) else None,
            "median_abs_log": float(np.median(np.abs(np.log(r)))) if len(r) else None}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet50,cifar_resnet20,deit_small_patch16_224,rrdbnet,"
                                        "deeplabv3plus_resnet50,ssd300_vgg16_split")
    ap.add_argument("--hold", default="", help="NAME=VALUE,...: parameters held fixed (an ablation; "
                                                "written to --out only, the model stays)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    hold = {k: float(v) for k, v in (kv.split("=") for kv in args.hold.split(",") if kv)}
    if hold and args.out == OUT:
        ap.error("--hold is an ablation: give --out a path other than results/latency_model.json")
    import torch

    torch.set_num_threads(1)
    meta, multi, single = entries()
    models = args.models.split(",")
    feats = build_features(multi, models)
    multi = [e for e in multi if fkey(e) in feats]
    moved = [e for e in multi if drifted(e)]  # measured on a host of another speed than its trace: counted apart
    fitted = [e for e in multi if not drifted(e)]
    halves = {h: [e for e in es if not drifted(e)] for h, es in zip("AB", split(multi), strict=True)}
    with ProcessPoolExecutor(2) as ex:  # the two cross-validation folds at once (cold: no committed fit)
        fits = {h: j.result() for h, j in [(h, ex.submit(fit, halves[h], feats, meta, hold, False, f"[{h}] "))
                                            for h in "AB"]}
    fits["all"] = fit(fitted, feats, meta, hold, True, "[all] ", [fits[h][0] for h in "AB"])
    cal, cfit = fits["all"]
    other = {id(e): fits["B" if h == "A" else "A"][0] for h, es in halves.items() for e in es}  # fitted without e
    if CODEC_COST.is_file():  # measured apart (bench/codec_cost.py); fp32 and fp16, all the fit sees, cost nothing
        cc = json.loads(CODEC_COST.read_text())
        cal.codec_encode_s, cal.codec_decode_s = cc["codec_encode_s"], cc["codec_decode_s"]
    cal.single_process = {f"{e['model']}|{','.join(map(str, e['input_shape']))}": round(e["latency_ms_median"], 3)
                          for e in single}
    half = {id(e): h for h, es in halves.items() for e in es}
    old = [e for e in multi if e.get("predicted_by") != "planner"]  # the sweep's retired model's predictions
    # each entry's four predictions, once: the rows store them rounded, the summary counts them unrounded
    pred: dict[tuple[int, str], float] = {}
    for e in multi:
        for measured, f in ((True, "link_model_ms"), (False, "planner_ms")):
            pred[(id(e), f)] = predict_entry(e, feats, cal, measured)
            if id(e) in other:  # cross-validated: the half that did not see e
                pred[(id(e), f.replace("_ms", "_cv_ms"))] = predict_entry(e, feats, other[id(e)], measured)
    rows = [{"key": key(e), "half": half.get(id(e)), "measured_ms": e["latency_ms_median"],
             "old_predicted_ms": None if e.get("predicted_by") == "planner" else e["predicted_ms"],
             **{f: (round(pred[(id(e), f)], 3) if (id(e), f) in pred else None)
                for f in ("link_model_ms", "planner_ms", "link_model_cv_ms", "planner_cv_ms")},
             "weights": e.get("weights"), "loadavg_1min": e.get("loadavg_1min"),
             "host_drift": e.get("host_drift"), "retraced": e.get("retraced"),
             "messages_measured": e.get("messages_measured"), "launch_medians_ms": e.get("latency_ms_launch_medians"),
             "messages_program": sum(1 for p in feats[fkey(e)]["progs"] for s in p if s[0] == "s"),
             "kept_set": "reproduced" if (e.get("weights") or "").startswith("random") else
             "magnitude at the same r (the entry used a trained checkpoint not in the repository)"} for e in multi]
    out = {"calibration": {k: v for k, v in cal.__dict__.items() if k != "source"},
           "compute_fit_log_error": {"worst": cfit[0], "median": cfit[1]},
           "delay_pingpong_loaded": {k: [meta[m]["a_s"], meta[m]["b_s_per_byte"]]  # the sweep's, for the page
                                     for k, m in (("unshaped", "delay_loaded"), ("paced", "delay_loaded_paced"))},
           "method": __doc__.strip(),
           "summary": {"old model, all measured": summary(old, [e["predicted_ms"] for e in old])} | {
               f"{what}, {how}": summary(es, [pred[(id(e), f"{f}{cv}")] for e in es])
               for block in ((("fitted on all", fitted, "_ms"), ("cross-validated", fitted, "_cv_ms")),
                             ((f"host speed moved > {DRIFT:.2f}x (not fitted)", moved, "_ms"),))
               for what, f in (("link model (measured compute)", "link_model"), ("planner (compute model too)",
                                                                                 "planner"))
               for how, es, cv in block if es},
           "halves": {h: {k: v for k, v in fits[h][0].__dict__.items() if k != "source"} for h in "AB"},
           "entries": rows}
    args.out.write_text(json.dumps(out, indent=1))
    print(json.dumps(out["summary"], indent=1))
    print(json.dumps(out["calibration"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
