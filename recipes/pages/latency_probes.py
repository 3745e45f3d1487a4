"""What the retired latency probes measured (results/exchange_probe.json, io_nice.json, corun_probe.json,
inrun_probe.json, tbf_bucket.json) and the rerun on a drifting host (latency_slow_host.json), as sentences of
docs/latency-model.md. Each returns nothing (or a placeholder) when its results file is not there."""

from __future__ import annotations

import json
from pathlib import Path


def result_entries(results: Path, name: str) -> list[dict] | None:
    """The ``entries`` of results/``name``, None when that file is not there."""
    f = results / name
    return json.loads(f.read_text())["entries"] if f.is_file() else None


def launch_spread(rows: list[dict], field: str) -> list[float]:
    """Largest over smallest launch median of each multi-launch entry (``field`` holds the medians), sorted."""
    return sorted(max(r[field]) / min(r[field]) for r in rows if len(r.get(field) or []) > 1)


def exchange_probe(results: Path) -> str:
    """What the retired exchange_probe in bench/ARCHIVE.md measured, CIFAR ResNet-20 dense N=2."""
    rows = result_entries(results, "exchange_probe.json")
    if rows is None:
        return "(results/exchange_probe.json is not there yet.)"
    by = {(r["ratio_target"], r["io_nice"]): r["ranks"][0] for r in rows}
    parts = []
    for nice in (0, 19):
        r = by.get((1.0, nice))
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


def io_nice(results: Path) -> str:
    """The runtime change of 2026-12-04 and what it measured (the retired io_nice in bench/ARCHIVE.md)."""
    rows = result_entries(results, "io_nice.json")
    if rows is None:
        return "the retired io_nice in bench/ARCHIVE.md measures it (results/io_nice.json is not there yet)."
    return ("Measured with the retired `io_nice` in bench/ARCHIVE.md (results/io_nice.json), median of "
            "alternating runs, loopback: ") + \
        "; ".join(f"{r['model']} N={r['nodes']} r={r['ratio_target']:g} {r['median_ms']['0']:.1f} -> "
                  f"{r['median_ms']['19']:.1f} ms" for r in rows) + "."


def corun(results: Path) -> str:
    """What the co-run term is not (the retired corun_probe in bench/ARCHIVE.md)."""
    rows = result_entries(results, "corun_probe.json")
    if rows is None:
        return ""
    return ("; two plain one-thread forward passes at once on this host take "
            + ", ".join(f"{r['pair_slowdown']:.2f}x ({r['model']})" for r in rows)
            + " the time of one alone (the retired `corun_probe` in bench/ARCHIVE.md, "
            "results/corun_probe.json), so the slowdown the fit "
              "finds is what the node runtime adds while both nodes compute (its transport threads, gloo's I/O "
              "threads), not the models sharing the cores" + inrun_compute(results))


def inrun_compute(results: Path) -> str:
    """The compute slowdown measured inside real runs (the retired inrun_probe in bench/ARCHIVE.md)."""
    rows = result_entries(results, "inrun_probe.json")
    if rows is None:
        return ""
    x = [n["compute_over_alone"] for r in rows for n in r["per_node"]]
    return (f"; inside real N=2 runs each node's compute takes {min(x):.2f}x to {max(x):.2f}x its trace alone "
            "(the retired `inrun_probe` in bench/ARCHIVE.md, next line)")


def _inrun_one(r: dict) -> str:
    w, c = r["sent_to_a_waiting_node"], r["sent_to_a_computing_node_that_blocked_on_it"]
    return (f"{r['model']}: send end to wait end {w.get('median_ms', 0):.2f} ms median ({w.get('mean_ms', 0):.2f} "
            f"mean) to a waiting node, {c.get('median_ms', 0):.2f} ms ({c.get('mean_ms', 0):.2f}) to a computing "
            f"node that then blocked on it ({c['n']} messages; {r['sent_to_a_computing_node_there_in_time']} "
            "were there in time)")


def inrun(results: Path) -> str:
    """What the busy delay stands for, measured inside real runs (the retired inrun_probe in bench/ARCHIVE.md)."""
    rows = result_entries(results, "inrun_probe.json")
    if rows is None:
        return ""
    return ("; measured inside `disco run` at N=2 r=0.1 loopback (the retired `inrun_probe` in "
            "bench/ARCHIVE.md, results/inrun_probe.json: "
            "sends and waits timestamped in both node processes): " + "; ".join(_inrun_one(r) for r in rows))


def tbf(results: Path) -> list[str]:
    """The check of the tc bucket (the retired tbf_bucket in bench/ARCHIVE.md)."""
    rows = result_entries(results, "tbf_bucket.json")
    if rows is None:
        return []

    def med(b: dict) -> float:
        return sorted(b["measured_ms"])[len(b["measured_ms"]) // 2]

    return ["", "The tbf bucket, checked (the retired `tbf_bucket` in bench/ARCHIVE.md, results/tbf_bucket.json): "
                "the CIFAR tc settings "
            "launched alternately with the sweep's bucket and a small one, predicted with the committed "
            "calibration (the bucket's size is no parameter of the fit): " + "; ".join(
                f"{r['key']}: " + ", ".join(f"bucket {b['burst_bytes']} B measured {med(b):.1f} ms (median of "
                                           f"{len(b['measured_ms'])} launches), predicted {b['predicted_ms']:.1f}"
                                           for b in r["buckets"])
                + f" (without a bucket {r['predicted_ms_without_bucket']:.1f})" for r in rows) + "."]


def _key(e: dict) -> str:
    """An entry's key in results/latency_model.json: model|N|r|codec|Mbit/s|shaping."""
    return f"{e['model']}|{e['nodes']}|{e.get('ratio_target')}|{e['codec']}|{e['bandwidth_mbit']}|{e['shaping']}"


def _ratio_stats(rows: list[dict], base: dict[str, float]) -> str:
    r = sorted(e["latency_ms_median"] / base[_key(e)] for e in rows)
    return f"median {r[len(r) // 2]:.2f}x, range {r[0]:.2f}-{r[-1]:.2f}x over {len(r)} entries"


def slow_host(results: Path) -> list[str]:
    """What a rerun on this host measured while its speed drifted (results/latency_slow_host.json, the sweep of
    bench/latency.py with launches, kept apart from results/latency.json): the rerun over the fitted sweep, split
    into link-bound entries (10 and 100 Mbit/s) and compute-bound ones (1 Gbit/s and unshaped)."""
    rerun_entries = result_entries(results, "latency_slow_host.json")
    if rerun_entries is None:
        return []
    base = {_key(e): e["latency_ms_median"] for e in json.loads((results / "latency.json").read_text())["entries"]
            if e.get("latency_ms_median") and e["nodes"] > 1}
    measured = [e for e in rerun_entries if e.get("latency_ms_median")]
    rerun = [e for e in measured if _key(e) in base]
    single = {e["model"]: e["latency_ms_median"] for e in measured if e["mode"] == "single"}
    link = [e for e in rerun if e["bandwidth_mbit"] in (10, 100)]
    comp = [e for e in rerun if e["bandwidth_mbit"] not in (10, 100)]
    n1 = [e for e in measured if e["nodes"] == 1 and e["mode"] == "dense" and e["model"] in single]
    spread = launch_spread(rerun, "latency_ms_launch_medians")
    text = ("`results/latency_slow_host.json` is the same sweep rerun on 2026-12-04 (third run of that day, 87 "
            "minutes, every run predicted below 100 ms over 3 launches, see bench/README.md). Measured against the "
            f"sweep fitted above: link-bound entries (10 and 100 Mbit/s) {_ratio_stats(link, base)}; compute-bound "
            f"entries (1 Gbit/s and unshaped) {_ratio_stats(comp, base)}.")
    if n1:
        text += " Within the rerun, one node process with the whole model (N = 1) took " + ", ".join(
            f"{e['latency_ms_median']:.1f} ms ({e['model']})" for e in n1) + " against " + ", ".join(
            f"{single[e['model']]:.1f} ms" for e in n1) + " for plain PyTorch in the same sweep minutes before."
    if spread:
        text += (f" The launch medians of one entry differ by up to {spread[-1]:.2f}x (median "
                 f"{spread[len(spread) // 2]:.2f}x over {len(spread)} entries).")
    text += (" The links cost what they cost before; compute ran slower for part of the run, after the compute "
             "traces were taken, and neither the load average nor the steal time showed it. The fit is kept on "
             "the sweep above; a model fitted on this rerun would fit a host that changed speed under it.")
    return ["", "## A rerun on a host whose speed drifted", "", text]
