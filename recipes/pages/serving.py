"""The split as a service under load (bench/serve.py -> results/serve.json): the runs, the fault runs and issue
41's targets stated from the data (a target whose runs are missing, or measured on fewer requests than it names,
says so)."""

from __future__ import annotations

import numpy as np

from .md import md_table, opt

SERVE = "serve"
TARGET_REQUESTS = 10000


def _runs(data: dict, kind: str, **match: object) -> list[dict]:
    return [e for e in data.get("runs", []) if e.get("kind") == kind and all(e.get(k) == v for k, v in match.items())]


def _link(e: dict) -> str:
    return "-" if e.get("server") == "whole" else f"{e['codec']} @ {e['bandwidth']}"


def _peak(e: dict, rank: int) -> float | None:
    p = e.get("peak_rss_mb_per_node") or []
    return p[rank] if rank < len(p) else None


def _load_table(data: dict) -> str:
    rows = []
    for e in _runs(data, "load"):
        server = "one process, whole model" if e["server"] == "whole" else f"N={data['setup']['nodes']} split"
        rows.append([server, _link(e), e["clients"], e["requests"], opt(e.get("throughput_per_s"), "{:.1f}"),
                     opt(e.get("latency_ms_p50"), "{:.0f}"), opt(e.get("latency_ms_p99"), "{:.0f}"), e["failed"],
                     e["wrong"], e["hung"], opt(_peak(e, 0), "{:.0f}"),
                     opt(_peak(e, 1) if e["server"] != "whole" else None, "{:.0f}"),
                     opt(e.get("host_cpu_busy"), "{:.0%}")])
    return md_table(rows, ["server", "link", "clients K", "requests", "answers/s", "p50 ms", "p99 ms", "failed",
                           "wrong", "hung", "rank 0 peak RSS MB", "rank 1 peak RSS MB", "host CPU busy"])


def _fault_table(data: dict) -> str:
    load_s = next((e["rank1_load_s"] for e in _runs(data, "load_time")), None)
    rows = []
    for e in _runs(data, "fault"):
        f = e.get("fault", {})
        rows.append([_link(e), e["clients"], e["requests"], e["answered"], e["failed"], e["failed_with_error_body"],
                     e["wrong"], e["hung"], opt(f.get("unready_after_s"), "{:.2f}"), opt(f.get("down_s"), "{:.2f}"),
                     opt(f.get("ready_again_s"), "{:.2f}"), opt(load_s, "{:.2f}")])
    return md_table(rows, ["link", "clients K", "requests", "answered", "failed", "failed with an error body",
                           "wrong", "hung", "not ready after the kill (s)", "down (s)",
                           "ready again after the restart (s)", "rank 1 load time (s)"])


def _drift(r: dict) -> tuple[float, float]:
    """(median of the second tenth of the RSS samples against the median of the last tenth, the single sample a
    tenth in against the last): relative changes. The samples dip right after each heap trim, so single samples
    are noisy; the medians of the sampled series (``series``, about 50 evenly spaced samples) are not."""
    ref = r.get("after_warmup", r["first"])
    single = abs(r["last"] - ref) / ref
    v = r.get("series") or []
    if len(v) < 20:
        return single, single
    k = len(v) // 10
    a, b = float(np.median(v[k:2 * k])), float(np.median(v[-k:]))
    return abs(b - a) / a, single


def _verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else ("met" if ok else "not met")


def _targets(data: dict) -> list[str]:
    out = []
    every = _runs(data, "load") + _runs(data, "fault")
    if every:
        wrong, hung = sum(e["wrong"] for e in every), sum(e["hung"] for e in every)
        bodies = all(e["failed"] == e["failed_with_error_body"] for e in every)
        ok = wrong == 0 and hung == 0 and bodies
        out.append(f"0 wrong and 0 hung answers in every run, fault runs included, every failure with an error body: "
                   f"{wrong} wrong, {hung} hung over {sum(e['requests'] for e in every)} requests in {len(every)} "
                   f"runs, {'every' if bodies else 'not every'} failure with an error body: **{_verdict(ok)}**.")
    for run in _runs(data, "disco_run"):
        link = f"{run['codec']} @ {run['bandwidth']}"
        k1 = _runs(data, "load", server="split", codec=run["codec"], bandwidth=run["bandwidth"], clients=1)
        if run.get("error") or not k1:
            out.append(f"Latency at K=1 within 1.15x of `disco run`'s, {link}: **not measured**.")
            continue
        ratio = k1[0]["latency_ms_p50"] / run["latency_ms_median"]
        out.append(f"Latency at K=1 within 1.15x of `disco run`'s, {link}: {k1[0]['latency_ms_p50']:.0f} ms served "
                   f"(p50) against {run['latency_ms_median']:.0f} ms (`disco run` median), {ratio:.2f}x: "
                   f"**{_verdict(ratio <= 1.15)}**.")
        peak0, base0 = _peak(k1[0], 0), (run.get("peak_rss_mb_per_node") or [None])[0]
        if peak0 is not None and base0 is not None:
            out.append(f"The HTTP front adds <= 30 MB to rank 0's peak RSS, {link}: {peak0:.0f} MB serving at K=1 "
                       f"against {base0:.0f} MB under `disco run`, +{peak0 - base0:.0f} MB: "
                       f"**{_verdict(peak0 - base0 <= 30)}**.")
    for link in {(e["codec"], e["bandwidth"]) for e in _runs(data, "load", server="split")}:
        if link[1] != "1gbit":
            continue
        by_k = {e["clients"]: e for e in _runs(data, "load", server="split", codec=link[0], bandwidth=link[1])}
        if 1 in by_k and 16 in by_k:
            g = by_k[16]["throughput_per_s"] / by_k[1]["throughput_per_s"]
            busy, busy16 = by_k[1].get("host_cpu_busy"), by_k[16].get("host_cpu_busy")
            cap = (f" The host's {data['setup'].get('host_cpus')} cores (nodes, front and clients on the same "
                   f"ones) were {busy:.0%} busy at K=1 and {busy16:.0%} at K=16: the overlap filled what the host "
                   "had left; on devices with a CPU each, a node's idle time while its messages travel is what it "
                   "fills." if busy and busy16 else "")
            out.append(f"At 1 Gbit/s ({link[0]}), throughput at K=16 >= 1.3x that at K=1: "
                       f"{by_k[16]['throughput_per_s']:.1f}/s against {by_k[1]['throughput_per_s']:.1f}/s, {g:.2f}x: "
                       f"**{_verdict(g >= 1.3)}**.{cap}")
    drift = []
    for e in _runs(data, "load", server="split"):
        for rank, r in (e.get("rss_mb_per_node") or {}).items():
            if r.get("samples", 0) >= 2:
                drift.append((*_drift(r), e["requests"], rank))
    if drift:
        worst = max(drift)
        n = max(d[2] for d in drift)
        long = [d for d in drift if d[2] >= TARGET_REQUESTS]
        if long:
            w = max(long)
            out.append(f"Node RSS flat (drift < 1%) over {TARGET_REQUESTS:,} requests: the largest change of a "
                       f"node's RSS (median of the run's second tenth of samples against the median of its last "
                       f"tenth; the first tenth is the warm-up) is {w[0]:.2%} (rank {w[3]}, {w[2]} requests; from "
                       f"the single sample a tenth into the run to the last one: {w[1]:.2%}): "
                       f"**{_verdict(w[0] < 0.01)}**.")
        else:
            out.append(f"Node RSS flat (drift < 1%) over {TARGET_REQUESTS:,} requests: **not measured** (the longest "
                       f"run had {n} requests; the largest change of a node's RSS over a run was {worst[0]:.2%}, "
                       f"rank {worst[3]}).")
    load_s = next((e["rank1_load_s"] for e in _runs(data, "load_time")), None)
    for e in _runs(data, "fault"):
        f = e.get("fault", {})
        if load_s is None or f.get("ready_again_s") is None:
            continue
        out.append(f"Ready again within the node's load time + 3 s after its process starts, {_link(e)}: "
                   f"{f['ready_again_s']:.2f} s against {load_s:.2f} + 3 s: "
                   f"**{_verdict(f['ready_again_s'] <= load_s + 3)}**.")
    return out


def section(data: dict) -> str:
    """The generated part of docs/serving.md."""
    s = data.get("setup", {})
    n_req = sorted({e["requests"] for e in _runs(data, "load")})
    runs = s.get("commands") or [{"command": s.get("command"), "load_average_at_start": s.get(
        "load_average_at_start", [])}]
    how = "; ".join(f"`{r['command']}` (load average {', '.join(f'{v:.1f}' for v in r['load_average_at_start'])} "
                    "at its start)" for r in runs)
    head = (f"{s.get('model')} {'x'.join(map(str, s.get('input_shape', [])[1:]))}, N={s.get('nodes')}, "
            f"r={s.get('ratio')}, {s.get('pool_inputs')} different inputs cycled by the clients; "
            f"{', '.join(map(str, n_req))} requests per load run; measured on a {s.get('host_cpus')}-core host "
            f"that other jobs shared (the absolute figures are pessimistic) with {how}.")
    parts = [head, "", _load_table(data), "", "Fault runs (SIGKILL of rank 1 after 3 s of load, the same command "
             "again 2 s later; the clients go on until the group is ready again, and wait 0.1 s after a failed "
             "request):", "", _fault_table(data), "", "Targets of issue 41:", ""]
    parts += [f"- {t}" for t in _targets(data)]
    return "\n".join(parts)
