"""Fit the planner's latency model on results/latency.json, and cross-validate it.

    OMP_NUM_THREADS=1 .venv/bin/python bench/latency_fit.py            # features (cached) + fits + report (~32 min)
    .venv/bin/python bench/latency_fit.py --report                      # the report from the stored fit only
    OMP_NUM_THREADS=1 .venv/bin/python bench/codec_cost.py             # int8/bf16 codec costs (a fit keeps the last)

For every measured entry of results/latency.json the script rebuilds the entry's kept set (the
benchmark's: random init, seed 0, one-shot global magnitude selection; the CIFAR entries that
used a trained checkpoint get the magnitude set at the same r instead, and say so) and the node
programs of :func:`disco.planner.programs` (compute segments as FLOPs / ops / messages / bytes).

Each fit has two parts:

1. **compute**: each node's measured compute (``compute_ms_per_node``: its plan alone, 1 thread,
   no communication) = flop_s * FLOPs + op_s * ops + msg_s * messages + byte_s * bytes (least squares).
2. **link**: with each node's compute rescaled to what was measured, ``replay`` (2 cores shared
   by the node processes, as on the benchmark host) with a per-message delay a + b*S, a wake-up, a CPU
   overhead after every received message o + o_b*S and the cores' share when node processes share them,
   separately for unshaped and paced links (``fit_link``): most entries within 1.25x, then the least
   mean squared log-error.

Three fits: on every entry (the calibration ``disco plan`` uses; entries measured while the host's speed
moved are left out and checked apart), and one on each half of a checkerboard split (``split``) to
cross-validate: each entry is also predicted by the fit that did not see it.

Writes results/latency_model.json: the calibration, the halves' fits, and per entry measured, the old
prediction, the link model's (measured compute) and the planner's (compute model too), each from the fit on
all and cross-validated.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

sys.path.insert(0, str(ROOT / "bench"))

from host import DRIFT  # noqa: E402
from netns import tbf_burst  # noqa: E402

from disco import planner  # noqa: E402
from disco.runtime import latency as lat  # noqa: E402
from disco.runtime.transport import LinkModel  # noqa: E402

SRC = ROOT / "results" / "latency.json"
OUT = ROOT / "results" / "latency_model.json"
CODEC_COST = ROOT / "results" / "codec_cost.json"
DOC = ROOT / "docs" / "latency-model.md"
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


def pingpong(meta: dict) -> dict[str, list[float]]:
    """The loaded ping-pongs' delivery delay [a, b] (the sweep's meta), for the page."""
    return {k: [meta[m]["a_s"], meta[m]["b_s_per_byte"]]
            for k, m in (("unshaped", "delay_loaded"), ("paced", "delay_loaded_paced"))}


def split(multi: list[dict]) -> tuple[list[dict], list[dict]]:
    """The cross-validation's halves A and B, a checkerboard within each (model, N, link kind) group: an entry
    is in A when the ranks of its ratio, codec and bandwidth within the group add up to an even number. Both
    halves see every group, every codec and every ratio of it (every other entry in key order put all fp16
    entries of a group in one half and all fp32 ones in the other, as the two codecs alternate in key order,
    so a half never saw the larger messages of a setting)."""
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
    calib = [e for e in multi if rank[id(e)] % 2 == 0]
    held = [e for e in multi if rank[id(e)] % 2]
    return calib, held


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


def predict_entry(e: dict, feats: dict, cal: planner.Calibration, measured_compute: bool,
                  burst: int | None = None) -> float:
    """Predicted ms of entry ``e`` (``measured_compute``: its traced compute, else the compute model's); a tc
    entry's tbf bucket is ``burst`` bytes (default the sweep's, ``tbf_burst``; 0: every byte paced)."""
    f = feats[f"{e['model']}|{e['nodes']}|{e['ratio_target']}|{e['codec']}"]
    progs = planner.price(f["progs"], cal, compute_ms=e["compute_ms_per_node"] if measured_compute else None,
                          codec=e["codec"])
    bw = None if e["bandwidth_mbit"] is None else e["bandwidth_mbit"] * 1e6
    if bw is not None and e["shaping"] == "tc":
        bw *= TCP_GOODPUT
    if e["shaping"] == "tc":  # kernel shaping (tbf's bucket), no pacing: the unshaped delay, nothing else
        return lat.replay(progs, LinkModel(bw, 0.0), CORES, cal.delay(False), 0.0,
                          cal.oversub, cal.corun,
                          (tbf_burst(e["bandwidth_mbit"]) if burst is None else burst) * TCP_GOODPUT, cal.busy_s) * 1e3
    return planner.predict_ms(progs, bw, 0.0, cal, CORES)  # paced or unshaped: what `disco plan` predicts


def err(es: list[dict], feats: dict, cal: planner.Calibration, measured_compute: bool) -> np.ndarray:
    return np.array([math.log(e["latency_ms_median"] / predict_entry(e, feats, cal, measured_compute)) for e in es])


# the coordinate-descent candidates of each link kind's parameters (after the coarse grid)
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


# coordinate descent starts from the previous fit (disco.planner's defaults; a rerun on the same entries
# keeps it unless it finds better) and from the coarse grid's best with these values of the parameters the
# grid does not set (the delay starts at the ping-pong's)
STARTS = {"unshaped": [{"wake_oversub_s": w} for w in (0.0, 0.1e-3, 0.3e-3)], "paced": [{}]}


RANDOM_DRAWS, RANDOM_KEEP = 1500, 3  # seeded random points of FINE's grid; the best few start a descent too


def random_starts(space: dict[str, list[float]], score: Callable[[dict], tuple[float, float]],
                  draws: int = RANDOM_DRAWS, keep: int = RANDOM_KEEP, seed: int = 0) -> list[dict]:
    """The ``keep`` best of ``draws`` seeded random points of the grid ``space`` (by ``score``, lower is better):
    starts for coordinate descent that do not depend on the previous fit or on the coarse grid."""
    rng = np.random.default_rng(seed)
    pts = [{k: float(v[rng.integers(len(v))]) for k, v in space.items()} for _ in range(draws)]
    scored = sorted(((score(p), i) for i, p in enumerate(pts)))
    return [pts[i] for _, i in scored[:keep]]


def fit_link(calib: list[dict], feats: dict, cal: planner.Calibration, meta: dict,
             hold: dict[str, float] | None = None, warm: bool = True, label: str = "",
             seeds: Sequence[planner.Calibration] = ()) -> planner.Calibration:
    """Fit on the entries ``calib``, for unshaped and paced links apart: the delivery delay ``a + b*S``,
    the wake-up of a node blocked on a message, the CPU overhead after each received message ``o + o_b*S``
    and (unshaped) the useful share of the cores when 4 node processes share 2. A coarse grid with the
    delay of the loaded ping-pong (``meta.delay_loaded*``) first, then coordinate descent over ``FINE``
    with the delay free: the ping-pong, one message at a time beside a synthetic load, is a noisy
    estimate of the delay inside a run (its one-way times are not even monotone in the size). Its slope,
    what a byte costs to copy through loopback, bounds the per-byte delay at twice its value: a steeper
    slope fitted on small messages (CIFAR's 32 KB) would charge the megabyte messages of resnet50 for what is
    a per-message cost (resnet50 dense N=2 measures the same at fp16 and fp32). Coordinate descent
    is path-dependent, so it starts from the previous fit (``disco.planner.Calibration``'s defaults; only
    when ``warm``: a cross-validation fold must not start from a fit that saw the other half), from the
    grid's best with ``STARTS`` and from the best of ``RANDOM_DRAWS`` seeded random points of ``FINE``'s
    grid (``random_starts``) and from ``seeds`` (the fit on all entries starts from the halves' fits too,
    so it scores at least what they score on all entries), and keeps the best: a rerun on the same entries
    returns the committed fit, and a refit never scores below the fit it replaces. The
    objective is the number of entries within 1.25x, ties broken by the mean squared log-error.
    tc entries (no pacing, gloo through a tbf-shaped veth) take the unshaped delay and tbf's bucket, and count
    with the unshaped entries. ``hold`` fixes
    parameters at a value (an ablation: ``--hold corun=1`` fits the model without the co-run term)."""
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
            le = err(es, feats, planner.Calibration(**(base | p)), True)
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
        best_score, best = None, None
        prev = planner.Calibration()  # the committed fit (disco.planner's defaults): kept unless beaten
        starts = [{k: getattr(prev, k) for k in FINE[kind]} | hold] * warm + \
            [{k: getattr(c, k) for k in FINE[kind]} | hold for c in seeds] + \
            [{k: base[k] for k in FINE[kind]} | s | dict(grid_best) | hold for s in STARTS[kind]] + \
            [p | hold for p in random_starts({k: [v for v in vs if k not in ("delay_b", "delay_paced_b") or v <= bmax]
                                              for k, vs in FINE[kind].items()}, lambda p: score(p | hold))]
        for cur in starts:  # coordinate descent is path-dependent: a few starts, the best kept
            cur_score = score(cur)
            for _ in range(8):  # coordinate descent until no parameter moves
                moved = False
                for name, values in FINE[kind].items():
                    for v in [] if name in hold else values:
                        if name in ("delay_b", "delay_paced_b") and v > bmax:
                            continue
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
    """The compute fit, then the link fit, on the entries ``es``; the calibration and the compute fit's
    [worst, median] absolute log-error."""
    coef, cfit = fit_compute(es, feats)
    cal = planner.Calibration(flop_s=coef[0], op_s=coef[1], msg_s=coef[2], byte_s=coef[3])
    return fit_link(es, feats, cal, meta, hold, warm, label, seeds), cfit


def drifted(e: dict) -> bool:
    """Whether the host's speed probe around the entry's run (after the sweep re-traced and measured it once
    more) still moved more than ``DRIFT`` from the probe taken with its compute trace."""
    return (e.get("host_drift") or 1.0) > DRIFT


def launch_spread(rows: list[dict], field: str) -> list[float]:
    """Largest over smallest launch median of each multi-launch entry (``field`` holds the medians), sorted."""
    return sorted(max(r[field]) / min(r[field]) for r in rows if len(r.get(field) or []) > 1)


def summary(es: list[dict], preds: list[float]) -> dict:
    r = np.array([e["latency_ms_median"] / p for e, p in zip(es, preds, strict=True)])
    return {"n": len(es), "within_1.25x": int(((r >= 0.8) & (r <= 1.25)).sum()),
            "worst_ratio": float(r[np.argmax(np.abs(np.log(r)))]) if len(r) else None,
            "median_abs_log": float(np.median(np.abs(np.log(r)))) if len(r) else None}


def _old_ratios(entries: list[dict], unshaped_n4: bool) -> str:
    """The old model's error on one group of entries (keys MODEL|N|r|codec|Mbit|shaping): for unshaped N=4,
    old prediction / measured; for paced 1 Gbit/s, measured / old prediction."""
    def group(k: list[str]) -> bool:
        return (k[1] == "4" and k[5] != "pacing") if unshaped_n4 else (k[4] == "1000" and k[5] == "pacing")

    r = [(e["old_predicted_ms"] / e["measured_ms"]) if unshaped_n4 else (e["measured_ms"] / e["old_predicted_ms"])
         for e in entries if group(e["key"].split("|"))]
    return f"median {np.median(r):.2f}x, from {min(r):.2f} to {max(r):.2f}x over {len(r)} entries" if r else "none"


def _pingpong(out: dict) -> str:
    pp = out.get("delay_pingpong_loaded")
    if not pp:
        return "no ping-pong recorded"
    return (f"the loaded ping-pong alone gave unshaped {pp['unshaped'][0] * 1e6:.0f} us + "
            f"{pp['unshaped'][1] * 1e9:.2f} ns/B, paced {pp['paced'][0] * 1e6:.0f} us + "
            f"{pp['paced'][1] * 1e9:.2f} ns/B")


def _result_entries(name: str) -> list[dict] | None:
    """The ``entries`` of results/``name`` (a probe's output), None when that probe has not run."""
    f = ROOT / "results" / name
    return json.loads(f.read_text())["entries"] if f.is_file() else None


def _probe() -> str:
    """What bench/exchange_probe.py measured (results/exchange_probe.json), CIFAR ResNet-20 dense N=2."""
    f = ROOT / "results" / "exchange_probe.json"
    if not f.is_file():
        return "(results/exchange_probe.json is not there yet.)"
    rows = {(r["ratio_target"], r["io_nice"]): r["ranks"][0] for r in json.loads(f.read_text())["entries"]}
    parts = []
    for nice in (0, 19):
        r = rows.get((1.0, nice))
        if r is None:
            continue
        loop = sum(v for k, v in r["thread_cpu_s"].items() if k.startswith("gloo"))
        parts.append(f"at niceness {nice} the leader's gloo I/O thread used {loop:.2f} s of CPU in a "
                     f"{r['wall_s']:.2f} s dense CIFAR ResNet-20 N=2 run (its main thread "
                     f"{r['thread_cpu_s'].get('python', float('nan')):.2f} s), an `isend` blocked "
                     f"{r['isend_ms']['median']:.2f} ms at the median and {r['isend_ms']['p90']:.2f} ms at the "
                     f"90th percentile, and the main thread's CPU per inference was "
                     f"{r['main_cpu_ms_per_inference']:.2f} ms against "
                     f"{r['main_cpu_ms_per_inference_zero_cost_transport']:.2f} ms with a zero-cost transport")
    return ("Measured: " + "; ".join(parts) + ".") if parts else ""


def _io_nice() -> str:
    """The runtime change of 2026-12-04 and what it measured (results/io_nice.json of bench/io_nice.py)."""
    rows = _result_entries("io_nice.json")
    if rows is None:
        return "bench/io_nice.py measures it (results/io_nice.json is not there yet)."
    return "Measured with `bench/io_nice.py` (results/io_nice.json), median of alternating runs, loopback: " + \
        "; ".join(f"{r['model']} N={r['nodes']} r={r['ratio_target']:g} {r['median_ms']['0']:.1f} -> "
                  f"{r['median_ms']['19']:.1f} ms" for r in rows) + "."


def _slow_host() -> list[str]:
    """What a rerun on this host measured while its speed drifted (results/latency_slow_host.json, the sweep of
    bench/latency.py with launches, kept apart from results/latency.json): the rerun over the fitted sweep, split
    into link-bound entries (10 and 100 Mbit/s) and compute-bound ones (1 Gbit/s and unshaped)."""
    f = ROOT / "results" / "latency_slow_host.json"
    if not f.is_file():
        return []
    base = {key(e): e["latency_ms_median"] for e in json.loads(SRC.read_text())["entries"]
            if e.get("latency_ms_median") and e["nodes"] > 1}
    measured = [e for e in json.loads(f.read_text())["entries"] if e.get("latency_ms_median")]
    rerun = [e for e in measured if key(e) in base]
    single = {e["model"]: e["latency_ms_median"] for e in measured if e["mode"] == "single"}

    def stats(rows: list[dict]) -> str:
        r = sorted(e["latency_ms_median"] / base[key(e)] for e in rows)
        return f"median {r[len(r) // 2]:.2f}x, range {r[0]:.2f}-{r[-1]:.2f}x over {len(r)} entries"

    link = [e for e in rerun if e["bandwidth_mbit"] in (10, 100)]
    comp = [e for e in rerun if e["bandwidth_mbit"] not in (10, 100)]
    n1 = [e for e in measured if e["nodes"] == 1 and e["mode"] == "dense" and e["model"] in single]
    spread = launch_spread(rerun, "latency_ms_launch_medians")
    L = ["", "## A rerun on a host whose speed drifted", "",
         "`results/latency_slow_host.json` is the same sweep rerun on 2026-12-04 (third run of that day, 87 "
         "minutes, every run predicted below 100 ms over 3 launches, see bench/README.md). Measured against the "
         f"sweep fitted above: link-bound entries (10 and 100 Mbit/s) {stats(link)}; compute-bound entries "
         f"(1 Gbit/s and unshaped) {stats(comp)}."]
    if n1:
        L[-1] += " Within the rerun, one node process with the whole model (N = 1) took " + ", ".join(
            f"{e['latency_ms_median']:.1f} ms ({e['model']})" for e in n1) + " against " + ", ".join(
            f"{single[e['model']]:.1f} ms" for e in n1) + " for plain PyTorch in the same sweep minutes before."
    if spread:
        L[-1] += (f" The launch medians of one entry differ by up to {spread[-1]:.2f}x (median "
                  f"{spread[len(spread) // 2]:.2f}x over {len(spread)} entries).")
    L[-1] += (" The links cost what they cost before; compute ran slower for part of the run, after the compute "
              "traces were taken, and neither the load average nor the steal time showed it. The fit is kept on "
              "the sweep above; a model fitted on this rerun would fit a host that changed speed under it.")
    return L


def _corun() -> str:
    """What the co-run term is not (bench/corun_probe.py), when the probe has run."""
    rows = _result_entries("corun_probe.json")
    if rows is None:
        return ""
    return ("; two plain one-thread forward passes at once on this host take "
            + ", ".join(f"{r['pair_slowdown']:.2f}x ({r['model']})" for r in rows)
            + " the time of one alone (`bench/corun_probe.py`, results/corun_probe.json), so the slowdown the fit "
              "finds is what the node runtime adds while both nodes compute (its transport threads, gloo's I/O "
              "threads), not the models sharing the cores" + _inrun_compute())


def _inrun_compute() -> str:
    """The compute slowdown measured inside real runs (bench/inrun_probe.py), when the probe has run."""
    rows = _result_entries("inrun_probe.json")
    if rows is None:
        return ""
    x = [n["compute_over_alone"] for r in rows for n in r["per_node"]]
    return (f"; inside real N=2 runs each node's compute takes {min(x):.2f}x to {max(x):.2f}x its trace alone "
            "(`bench/inrun_probe.py`, next line)")


def _inrun() -> str:
    """What the busy delay stands for, measured inside real runs (bench/inrun_probe.py), when the probe has run."""
    rows = _result_entries("inrun_probe.json")
    if rows is None:
        return ""

    def one(r: dict) -> str:
        w, c = r["sent_to_a_waiting_node"], r["sent_to_a_computing_node_that_blocked_on_it"]
        return (f"{r['model']}: send end to wait end {w.get('median_ms', 0):.2f} ms median ({w.get('mean_ms', 0):.2f} "
                f"mean) to a waiting node, {c.get('median_ms', 0):.2f} ms ({c.get('mean_ms', 0):.2f}) to a computing "
                f"node that then blocked on it ({c['n']} messages; {r['sent_to_a_computing_node_there_in_time']} "
                "were there in time)")

    return ("; measured inside `disco run` at N=2 r=0.1 loopback (`bench/inrun_probe.py`, results/inrun_probe.json: "
            "sends and waits timestamped in both node processes): " + "; ".join(one(r) for r in rows))


def _tbf() -> list[str]:
    """The check of the tc bucket (bench/tbf_bucket.py), when it has run."""
    rows = _result_entries("tbf_bucket.json")
    if rows is None:
        return []

    def med(b: dict) -> float:
        return sorted(b["measured_ms"])[len(b["measured_ms"]) // 2]

    return ["", "The tbf bucket, checked (`bench/tbf_bucket.py`, results/tbf_bucket.json): the CIFAR tc settings "
            "launched alternately with the sweep's bucket and a small one, predicted with the committed "
            "calibration (the bucket's size is no parameter of the fit): " + "; ".join(
                f"{r['key']}: " + ", ".join(f"bucket {b['burst_bytes']} B measured {med(b):.1f} ms (median of "
                                           f"{len(b['measured_ms'])} launches), predicted {b['predicted_ms']:.1f}"
                                           for b in r["buckets"])
                + f" (without a bucket {r['predicted_ms_without_bucket']:.1f})" for r in rows) + "."]


def page(out: dict) -> str:
    """docs/latency-model.md from results/latency_model.json."""
    c = out["calibration"]
    L = ["# The latency model: calibration and how far to trust it", "",
         "Generated by `bench/latency_fit.py` from `results/latency_model.json` (which it fits on "
         "`results/latency.json`); do not edit by hand.", "",
         "## The sweep's first-order model", "",
         "`bench/latency.py` predicts each entry as it measures it (the `old_predicted_ms` of the entries "
         "below): it replays the per-node traces with one per-message CPU overhead after every received message "
         "on unshaped links, calibrated on one run (resnet50 dense N=2 loopback), none on paced links, and the "
         "ping-pong's delay. One overhead per message cannot serve both ends of the sweep: on unshaped N=4 its "
         f"prediction / measured is {_old_ratios(out['entries'], True)}; on paced 1 Gbit/s measured / prediction "
         f"is {_old_ratios(out['entries'], False)}. The fitted model below separates what the measurements "
         "show: a node that blocks on a message that has not arrived pays a wake-up (process and gloo thread) "
         "once per blocking wait, not per message; a message already there costs little; a received byte costs "
         "CPU (the loopback copy); and the cores' useful share while more node processes compute than there "
         "are cores is a fitted term (below).", "",
         "## The runtime's part", "",
         "Timestamps inside the node processes (each send and wait, and each thread's CPU time; "
         f"`bench/exchange_probe.py`) showed where an unshaped exchange round went. {_probe()} gloo's event "
         "loop (one I/O thread per process) polls a connection while the main thread holds that connection's "
         "lock; at equal priority it takes the cores from the node processes and stalls the peer's sends for "
         "up to a scheduler slice. The runtime now runs gloo's I/O threads at niceness 19 (`disco run "
         "--io-nice`, default 19; they still run whenever a core is free, which is when a node waits for a "
         f"message). {_io_nice()} The sweep in results/latency.json was measured with it.", "",
         "## The model now (`disco.planner`, `disco.runtime.latency.replay`)", "",
         "- compute per node, from the cost model: "
         f"{c['flop_s'] * 1e12:.2f} ps per FLOP, {c['op_s'] * 1e6:.1f} us per op, {c['msg_s'] * 1e6:.1f} us per "
         f"message sent and {c['byte_s'] * 1e9:.3f} ns per byte sent (fitted on the measured per-node compute; "
         f"worst log-error {out['compute_fit_log_error']['worst']:.3f})",
         f"- delivery delay a + b*S: unshaped {c['delay_a'] * 1e6:.0f} us + {c['delay_b'] * 1e9:.2f} ns/B, paced "
         f"{c['delay_paced_a'] * 1e6:.0f} us + {c['delay_paced_b'] * 1e9:.2f} ns/B (fitted on the entries; "
         f"{_pingpong(out)})",
         f"- wake-up of a blocked node: unshaped {c['wake_unshaped_s'] * 1e6:.0f} us, paced "
         f"{c['wake_paced_s'] * 1e6:.0f} us",
         f"- CPU after each received message: unshaped {c['overhead_unshaped_s'] * 1e6:.0f} us + "
         f"{c['overhead_unshaped_byte_s'] * 1e9:.2f} ns/B, paced {c['overhead_paced_s'] * 1e6:.0f} us + "
         f"{c['overhead_paced_byte_s'] * 1e9:.2f} ns/B",
         f"- useful share of the cores when more node processes compute than there are cores: {c['oversub']:.2f}; "
         f"a blocked node's extra wake-up while node processes outnumber the cores (it waits for one): "
         f"{c.get('wake_oversub_s', 0.0) * 1e6:.0f} us",
         f"- speed of each node process while more than one computes at once on the 2-core host (the compute "
         f"traces time each node alone; fitted): {c.get('corun', 1.0):.2f}{_corun()}",
         f"- a message sent while the other node processes' computing fills every core but the sender's (2 cores: "
         f"at N=2 the receiver computes; at N=4 nearly always) arrives later by {c.get('busy_s', 0.0) * 1e6:.0f} us "
         f"(fitted; the receiver's gloo I/O thread waits for a core){_inrun()}",
         "- kernel shaping (the tc entries: tbf on each end of a veth, `bench/netns.py`): the unshaped delay, "
         "the bandwidth times the TCP goodput (1448 of each 1514-byte frame), and tbf's token bucket on each "
         "sender's egress (`burst_bytes` of `replay`: 1 ms of traffic, at least 16 KB): a message's first bytes "
         "leave at once when the bucket has refilled while the node computed, so a few-KB message is not paced "
         "at all; no parameter of its own (the tc entries count with the unshaped ones in the fit)",
         "", "## Measured against predicted", "",
         "'fitted on all': the calibration above, fitted on every entry but those measured while the host's "
         "speed moved (below); it is what `disco plan` uses. 'cross-validated': the entries split in two "
         "halves, a checkerboard over ratio, codec and bandwidth within each model, N and link kind (unshaped, "
         "paced, tc); the model fitted on one half predicts each entry of the other, which it never saw (the "
         "two halves' fits are in results/latency_model.json, `halves`). 'link model' uses each node's "
         "measured compute (what the link model alone predicts); 'planner' predicts the compute too (what "
         "`disco plan` does).", "",
         "| model | entries | within 1.25x | worst measured/predicted | median abs log-error |",
         "|---|---|---|---|---|"]
    for k, s in out["summary"].items():
        w = "-" if s["worst_ratio"] is None else f"{s['worst_ratio']:.2f}"
        m = "-" if s["median_abs_log"] is None else f"{s['median_abs_log']:.3f}"
        L.append(f"| {k} | {s['n']} | {s['within_1.25x']} | {w} | {m} |")

    def outside(field: str) -> list[dict]:
        return [r for r in out["entries"] if r.get(field) and not 0.8 <= r["measured_ms"] / r[field] <= 1.25]

    for field, what in (("link_model_ms", "the link model fitted on all"),
                        ("link_model_cv_ms", "the link model cross-validated, each entry predicted by the half "
                                             "that did not see it")):
        bad = outside(field)
        L += ["", f"Entries outside 1.25x, {what}: {len(bad)}", ""]
        if not bad:
            continue
        L += ["| entry (model, N, r, codec, Mbit/s, shaping) | measured ms | predicted ms | ratio | half | "
              "host speed moved | kept set |", "|---|---|---|---|---|---|---|"]
        for r in bad:
            speed = "-" if r.get("host_drift") is None else f"{r['host_drift']:.2f}x" + (" (re-traced)" if r.get(
                "retraced") else "")
            L.append(f"| {r['key']} | {r['measured_ms']:.1f} | {r[field]:.1f} | "
                     f"{r['measured_ms'] / r[field]:.2f} | {r['half'] or 'not fitted'} | {speed} | {r['kept_set']} |")
    probed = [r for r in out["entries"] if r.get("host_drift") is not None]
    if probed:
        moved = [r for r in probed if r["host_drift"] > DRIFT]
        L += ["", f"Host speed: the sweep timed one fixed convolution (`bench/host.py:speed_probe_ms`) when it "
              f"traced a node's compute and before and after each run. {sum(bool(r['retraced']) for r in probed)} "
              f"of the {len(probed)} runs found it moved more than {DRIFT:.2f}x from the trace's and were re-traced "
              f"and measured once more; {len(moved)} still moved that much the second time and are counted apart "
              "above (not fitted)" + (": " + ", ".join(
                  f"{r['key']} ({r['host_drift']:.2f}x, measured/predicted "
                  f"{r['measured_ms'] / r['link_model_ms']:.2f})" for r in moved) if moved else "") + "."]
    pairs = [(a, b) for a in out["entries"] for b in out["entries"]
             if a["key"].replace("fp16", "fp32") == b["key"] and "|0.0|fp16|" in a["key"]]
    if pairs:
        L += ["", "The noise floor: at r = 0 only the (uncoded) input and output cross, so the fp16 and fp32 "
              "entries run the same program; their measurements differ by "
              + ", ".join(f"{a['measured_ms'] / b['measured_ms']:.2f}x ({a['key'].split('|')[0]}, "
                          f"{a['key'].split('|')[4]} Mbit/s)" for a, b in pairs)
              + ": the same program measured twice in one sweep differs by up to that much, so a deterministic "
              "model has at most 1.56x (1.25 squared) between the two to place its one prediction."]
    L += _tbf()
    L += _slow_host()
    multi = [r for r in out["entries"] if len(r.get("launch_medians_ms") or []) > 1]
    if multi:
        spread = launch_spread(multi, "launch_medians_ms")
        L += ["", f"Launches: the {len(multi)} entries predicted below 100 ms are the median of all timed "
              f"inferences of {len(multi[0]['launch_medians_ms'])} launches of the same export (one launch of a "
              "few-ms run measures whichever fast or slow phase it meets, results/noise.json). The largest "
              "launch median of an entry is at most "
              f"{spread[-1]:.2f}x its smallest (median over these entries {spread[len(spread) // 2]:.2f}x)."]
    return "\n".join(L) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet50,cifar_resnet20,deit_small_patch16_224,rrdbnet,"
                                        "deeplabv3plus_resnet50,ssd300_vgg16_split")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--hold", default="", help="NAME=VALUE,...: parameters held fixed (an ablation; "
                                                "written to --out only, the page and the model stay)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    hold = {k: float(v) for k, v in (kv.split("=") for kv in args.hold.split(",") if kv)}
    if hold and args.out == OUT:
        ap.error("--hold is an ablation: give --out a path other than results/latency_model.json")
    if args.report:
        DOC.write_text(page(json.loads(OUT.read_text())))
        print(DOC.read_text())
        return 0
    import torch

    torch.set_num_threads(1)
    meta, multi, single = entries()
    models = args.models.split(",")
    feats = build_features(multi, models)
    multi = [e for e in multi if f"{e['model']}|{e['nodes']}|{e['ratio_target']}|{e['codec']}" in feats]
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
    # each entry's four predictions, once: the rows store them rounded, the summary counts them unrounded
    pred: dict[tuple[int, str], float] = {}
    for e in multi:
        for measured, f in ((True, "link_model_ms"), (False, "planner_ms")):
            pred[(id(e), f)] = predict_entry(e, feats, cal, measured)
            if id(e) in other:  # cross-validated: the half that did not see e
                pred[(id(e), f.replace("_ms", "_cv_ms"))] = predict_entry(e, feats, other[id(e)], measured)
    rows = []
    for e in multi:
        rows.append({"key": key(e), "half": half.get(id(e)), "measured_ms": e["latency_ms_median"],
                     "old_predicted_ms": e["predicted_ms"],
                     **{f: (round(pred[(id(e), f)], 3) if (id(e), f) in pred else None)
                        for f in ("link_model_ms", "planner_ms", "link_model_cv_ms", "planner_cv_ms")},
                     "weights": e.get("weights"), "loadavg_1min": e.get("loadavg_1min"),
                     "host_drift": e.get("host_drift"), "retraced": e.get("retraced"),
                     "messages_measured": e.get("messages_measured"),
                     "launch_medians_ms": e.get("latency_ms_launch_medians"),
                     "messages_program": sum(1 for p in feats[fkey(e)]["progs"] for s in p if s[0] == "s"),
                     "kept_set": "reproduced" if (e.get("weights") or "").startswith("random") else
                     "magnitude at the same r (the entry used a trained checkpoint not in the repository)"})

    def preds(es: list[dict], f: str) -> list[float]:
        return [pred[(id(e), f)] for e in es]

    out = {"calibration": {k: v for k, v in cal.__dict__.items() if k != "source"},
           "compute_fit_log_error": {"worst": cfit[0], "median": cfit[1]},
           "delay_pingpong_loaded": pingpong(meta),
           "method": __doc__.strip(),
           "summary": {
               "old model, all measured": summary(multi, [e["predicted_ms"] for e in multi]),
               "link model (measured compute), fitted on all": summary(fitted, preds(fitted, "link_model_ms")),
               "link model (measured compute), cross-validated": summary(fitted, preds(fitted, "link_model_cv_ms")),
               "planner (compute model too), fitted on all": summary(fitted, preds(fitted, "planner_ms")),
               "planner (compute model too), cross-validated": summary(fitted, preds(fitted, "planner_cv_ms")),
           } | ({
               f"link model (measured compute), host speed moved > {DRIFT:.2f}x (not fitted)": summary(
                   moved, preds(moved, "link_model_ms")),
               f"planner (compute model too), host speed moved > {DRIFT:.2f}x (not fitted)": summary(
                   moved, preds(moved, "planner_ms")),
           } if moved else {}),
           "halves": {h: {k: v for k, v in fits[h][0].__dict__.items() if k != "source"} for h in "AB"},
           "entries": rows}
    args.out.write_text(json.dumps(out, indent=1))
    if args.out == OUT:
        DOC.write_text(page(out))
    print(json.dumps(out["summary"], indent=1))
    print(json.dumps(out["calibration"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
