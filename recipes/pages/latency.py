"""The latency sweep (bench/latency.py, results/latency.json): the README's and docs/latency.md's tables,
bench/README.md's report and results/latency.png."""

from __future__ import annotations

import statistics
from pathlib import Path

from .md import md_table, opt

LATENCY_RATIOS = [1.0, 0.2, 0.1, 0.05, 0.0]
LATENCY_CODECS = ["fp32", "fp16"]
# the task models of the sweep (bench/latency.py --models ...): their gains over dense are listed one by one
LATENCY_TASK_MODELS = ("deit_small_patch16_224", "rrdbnet", "deeplabv3plus_resnet50", "ssd300_vgg16_split")
PACED_100 = {"bandwidth_mbit": 100, "shaping": "pacing"}


def _entries(data: dict | list) -> list[dict]:
    return data["entries"] if isinstance(data, dict) else data


def _headline_key(e: dict) -> tuple:
    return (e["model"], e["nodes"], e.get("shaping") or "", -(e.get("bandwidth_mbit") or 1e9),
            {"single": 0, "dense": 1, "disco": 2, "separated": 3}.get(e["mode"], 4), -(e["ratio"] or 0),
            e.get("codec") or "")


def latency_headline(data: dict | list) -> str:
    """ResNet-50 and the CIFAR model at N=2 and N=4: latency per link, measured beside predicted."""
    measured = [e for e in _entries(data) if e.get("latency_ms_median") is not None]
    rows = []
    for e in sorted(measured, key=_headline_key):
        dense = next((d for d in measured if d["mode"] == "dense" and d["model"] == e["model"]
                      and d["nodes"] == e["nodes"] and d.get("bandwidth_mbit") == e.get("bandwidth_mbit")
                      and d.get("shaping") == e.get("shaping") and d.get("codec") == "fp32"), None)
        link = "-" if e["mode"] == "single" else (
            f"{e['bandwidth_mbit']:g} Mbit/s {e['shaping']}" if e.get("bandwidth_mbit") else "loopback")
        speed = "-"
        if dense and e["mode"] != "single":
            speed = f"{dense['latency_ms_median'] / e['latency_ms_median']:.2f}x"
        rows.append([e["model"], e["nodes"], link, e["mode"], e.get("codec") or "-", opt(e.get("ratio")),
                     f"{e['latency_ms_median']:.1f}", opt(e.get("predicted_ms"), "{:.1f}"), speed,
                     f"{max(e.get('weight_bytes_per_node') or [0]) / 1e6:.2f}"])
    return md_table(rows, ["model", "N", "link", "mode", "codec", "r", "measured ms", "predicted ms", "vs dense",
                           "weights / node (MB)"])


def latency_short(data: dict | list) -> str:
    """Per model, N=2 over an emulated 100 Mbit/s link, fp32: dense within-layer parallelism against DISCO."""
    ok = [e for e in _entries(data) if e["nodes"] == 2 and e.get("bandwidth_mbit") == 100
          and e.get("shaping") == "pacing" and e.get("codec") == "fp32" and e.get("latency_ms_median") is not None]
    rows = []
    for model in sorted({e["model"] for e in ok}):
        dense = next((e for e in ok if e["model"] == model and e["mode"] == "dense"), None)
        if dense is None:
            continue
        at = {round(e["ratio"], 2): e["latency_ms_median"] for e in ok if e["model"] == model and e["mode"] == "disco"}
        rows.append([model, "x".join(str(v) for v in dense["input_shape"][1:]), f"{dense['latency_ms_median']:.0f}",
                     *(f"{at[r]:.0f}" if r in at else "-" for r in (0.2, 0.1, 0.05)),
                     f"{dense['latency_ms_median'] / at[0.1]:.1f}x" if 0.1 in at else "-"])
    return md_table(rows, ["model", "input", "dense ms", "DISCO r=0.2 ms", "DISCO r=0.1 ms", "DISCO r=0.05 ms",
                           "r=0.1 vs dense"])


def _get(entries: list[dict], **kw: object) -> dict | None:
    """The first measured entry whose fields equal ``kw``."""
    for e in entries:
        if all(e.get(k) == v for k, v in kw.items()) and e.get("latency_ms_median") is not None:
            return e
    return None


def _codec_lines(es: list[dict], big: str) -> list[str]:
    """The big model at N=2, 100 Mbit/s, per codec; fp16 against dense fp32; its weights per node."""
    out = []
    for codec in LATENCY_CODECS:
        d = _get(es, model=big, mode="dense", nodes=2, codec=codec, **PACED_100)
        s = _get(es, model=big, mode="disco", nodes=2, ratio_target=0.2, codec=codec, **PACED_100)
        if d and s:
            out.append(f"- {big}, N=2, 100 Mbit/s, {codec} on the wire: DISCO r=0.2 "
                       f"{s['latency_ms_median']:.0f} ms vs dense {d['latency_ms_median']:.0f} ms: "
                       f"**{d['latency_ms_median'] / s['latency_ms_median']:.2f}x faster** (model predicts "
                       f"{d['predicted_ms'] / s['predicted_ms']:.2f}x)")
    d32 = _get(es, model=big, mode="dense", nodes=2, codec="fp32", **PACED_100)
    s16 = _get(es, model=big, mode="disco", nodes=2, ratio_target=0.2, codec="fp16", **PACED_100)
    if d32 and s16:
        out.append(f"- {big}, N=2, 100 Mbit/s: DISCO r=0.2 with fp16 on the wire vs dense fp32: "
                   f"**{d32['latency_ms_median'] / s16['latency_ms_median']:.2f}x faster**")
    for n, r in ((2, 0.2), (4, 0.1)):
        e = next((e for e in es if e["model"] == big and e["nodes"] == n and e.get("ratio_target") == r
                  and e.get("weight_fraction_max") is not None), None)
        if e:
            out.append(f"- {big} weights per node at N={n}, r={r}: at most **{e['weight_fraction_max']:.3f}x** "
                       f"of the whole model ({max(e['weight_bytes_per_node']) / 1e6:.1f} MB of "
                       f"{e['params_dense'] * 4 / 1e6 if e.get('params_dense') else float('nan'):.1f} MB)")
    for model in sorted({e["model"] for e in es}, key=lambda m: m != big):
        one = _get(es, model=model, mode="single", nodes=1)
        rt = _get(es, model=model, mode="dense", nodes=1)
        if one and rt:
            out.append(f"- {model}, unshaped, N=1: the runtime takes {rt['latency_ms_median']:.2f} ms vs plain "
                       f"PyTorch {one['latency_ms_median']:.2f} ms: "
                       f"**{(rt['latency_ms_median'] / one['latency_ms_median'] - 1) * 100:+.0f}%**")
    return out


def _gain_lines(es: list[dict], big: str) -> list[str]:
    """Each task model's gain over dense at 100 Mbit/s fp32, and which gains most at N=2 r=0.1."""
    gains = []
    for model in LATENCY_TASK_MODELS:
        for n in (2, 4):
            d = _get(es, model=model, mode="dense", nodes=n, codec="fp32", **PACED_100)
            for r in sorted({e["ratio_target"] for e in es if e["model"] == model and e["nodes"] == n
                             and e.get("ratio_target") is not None and 0 < e["ratio_target"] < 1}, reverse=True):
                s = _get(es, model=model, mode="disco", nodes=n, ratio_target=r, codec="fp32", **PACED_100)
                if d and s:
                    gains.append((d["latency_ms_median"] / s["latency_ms_median"], model, n, r, d, s))
    out = [f"- {model}, N={n}, 100 Mbit/s, fp32: DISCO r={r:g} {s['latency_ms_median']:.0f} ms vs dense "
           f"{d['latency_ms_median']:.0f} ms: **{g:.2f}x faster** (model predicts "
           f"{d['predicted_ms'] / s['predicted_ms']:.2f}x)"
           for g, model, n, r, d, s in sorted(gains, key=lambda t: (t[1], t[2], -t[3]))]
    by_task = {model: g for g, model, n, r, _, _ in gains if r == 0.1 and n == 2}
    big_d = _get(es, model=big, mode="dense", nodes=2, codec="fp32", **PACED_100)
    big_s = _get(es, model=big, mode="disco", nodes=2, ratio_target=0.1, codec="fp32", **PACED_100)
    if big_d and big_s:
        by_task[big] = big_d["latency_ms_median"] / big_s["latency_ms_median"]
    if len(by_task) > 1:
        best = max(by_task, key=by_task.get)
        listing = ", ".join(f"{m} {g:.2f}x" for m, g in sorted(by_task.items(), key=lambda t: -t[1]))
        out.append(f"- largest gain over dense at N=2, r=0.1, 100 Mbit/s, fp32: **{best}** ({listing})")
    return out


def _post_lines(es: list[dict]) -> list[str]:
    """The leader's post-processing against the split model's latency, and the predictions' spread."""
    out = []
    for model in sorted({e["model"] for e in es}):
        one = _get(es, model=model, mode="single", nodes=1)
        if one is None or one.get("post_ms") is None:
            continue
        for n, r in ((2, 0.1), (4, 0.1)):
            s = _get(es, model=model, mode="disco", nodes=n, ratio_target=r, codec="fp32", **PACED_100)
            if s:
                p, t = one["post_ms"], s["latency_ms_median"]
                out.append(f"- {model}, leader's post-processing (box decoding + NMS, 1 thread, random weights): "
                           f"{p:.1f} ms = **{100 * p / (t + p):.1f}%** of N={n} DISCO r={r:g} at 100 Mbit/s "
                           f"({t:.0f} ms + {p:.1f} ms)")
    ratios = [e["latency_ms_median"] / e["predicted_ms"] for e in es
              if e.get("latency_ms_median") and e.get("predicted_ms")]
    if ratios:
        bad = sum(1 for x in ratios if x > 1.25 or x < 1 / 1.25)
        out.append(f"- measured / predicted over {len(ratios)} measurements: median {statistics.median(ratios):.2f}, "
                   f"range {min(ratios):.2f}..{max(ratios):.2f}; {bad} outside 1/1.25..1.25")
    return out


def headlines(entries: list[dict], big: str = "resnet50") -> list[str]:
    """The latency sweep's findings, one line each, from the entries."""
    return _codec_lines(entries, big) + _gain_lines(entries, big) + _post_lines(entries)


BENCH_COLUMNS = ["model", "mode", "N", "r", "codec", "link", "shaping", "measured ms", "predicted ms",
                 "no-overlap ms", "meas/pred", "bytes sent", "weights/node max", "peak RSS/node max", "rel. err",
                 "timed"]


def _bench_row(e: dict) -> list[object]:
    meas, pred = e.get("latency_ms_median"), e.get("predicted_ms")
    wb, rss = e.get("weight_bytes_per_node"), e.get("peak_rss_mb_per_node")
    return [e["model"], e["mode"], e["nodes"], opt(e.get("ratio"), "{:.3f}"), e.get("codec") or "-",
            "loopback" if e["bandwidth_mbit"] is None else f"{e['bandwidth_mbit']:g} Mbit/s",
            e.get("shaping") or "-", ("failed" if e.get("error") else "-") if meas is None else f"{meas:.1f}",
            opt(pred, "{:.1f}"), opt(e.get("predicted_ms_no_overlap"), "{:.1f}"),
            "-" if not (meas and pred) else f"{meas / pred:.2f}", opt(e.get("bytes_sent_total"), "{:,}"),
            "-" if not wb else f"{max(wb) / 1e6:.2f} MB", "-" if not rss else f"{max(rss):.0f} MB",
            opt(e.get("max_rel_err_vs_single_process"), "{:.1e}"), e.get("n_timed") or "-"]


def _cal_line(meta: dict, k: str) -> str:
    c = meta.get(k, {})
    return f"{c.get('a_s', 0) * 1e6:.0f} us + {c.get('b_s_per_byte', 0) * 1e9:.2f} ns/byte"


def latency_bench(data: dict) -> str:
    """bench/README.md's report: the host and calibration, the headlines, then every measured entry and every
    entry the latency model only predicted."""
    es = data["entries"]
    order = {"single": 0, "dense": 1, "disco": 2, "separated": 3}
    big = "resnet50" if any(e["model"] == "resnet50" for e in es) else es[0]["model"]
    es = sorted(es, key=lambda e: (e["model"] != big, e["nodes"], order[e["mode"]],
                                   -(e.get("ratio_target") or 0), {"fp32": 0, "fp16": 1}.get(e.get("codec"), 0),
                                   e["bandwidth_mbit"] if e["bandwidth_mbit"] is not None else 1e9,
                                   e.get("shaping") or ""))
    measured = [e for e in es if e.get("latency_ms_median") is not None or e.get("error")]
    rest = [e for e in es if e not in measured]
    rows = ["### Measured", "", md_table(map(_bench_row, measured), BENCH_COLUMNS)]
    if rest:
        rows += ["", "### Not measured (latency model only)", "", md_table(map(_bench_row, rest), BENCH_COLUMNS)]
    meta = data["meta"]
    lines = [
        "_Generated by `python -m recipes.pages` from results/latency.json._", "",
        f"Host: {meta.get('host_cpus')} CPUs, {meta.get('threads_per_node')} thread per node, torch "
        f"{meta.get('torch')}. Link model: {meta.get('link_model')}. Kernel shaping: {meta.get('tc')}.",
        f"Per-message delay d(S) = a + b*S fitted on gloo ping-pongs through DistTransport: idle cores "
        f"{_cal_line(meta, 'delay')} (through the pacing thread {_cal_line(meta, 'delay_paced')}); both ends "
        f"computing between messages {_cal_line(meta, 'delay_loaded')} (paced {_cal_line(meta, 'delay_loaded_paced')})."
        f" The model uses the {meta.get('delay_model', 'loaded')} ones.", "",
        *headlines(es, big), "", *rows,
    ]
    return "\n".join(lines)


def _plot_one(ax, es: list[dict], model: str, n: int, loop_x: int) -> None:  # noqa: ANN001
    """One panel: per ratio and codec, the predicted line and the measured markers; the tc runs apart."""
    colors = {1.0: "C3", 0.2: "C0", 0.1: "C2", 0.05: "C4", 0.0: "C7"}
    for r in LATENCY_RATIOS:
        for codec in LATENCY_CODECS:
            sel = [e for e in es if e["model"] == model and e["nodes"] == n and e.get("ratio_target") == r
                   and e.get("codec") == codec and e.get("shaping") in ("pacing", None)]
            if not sel:
                continue
            sel.sort(key=lambda e: e["bandwidth_mbit"] or loop_x)
            xs = [e["bandwidth_mbit"] or loop_x for e in sel]
            ls = "-" if codec == "fp32" else "--"
            name = {1.0: "dense", 0.0: "separated"}.get(r, f"DISCO r={r}")
            ax.plot(xs, [e["predicted_ms"] for e in sel], ls, color=colors[r], alpha=0.35, lw=1)
            m = [(x, e["latency_ms_median"]) for x, e in zip(xs, sel, strict=True) if e["latency_ms_median"]]
            if m:
                ax.plot(*zip(*m, strict=True), "o" + ls, color=colors[r], label=f"{name} {codec}", ms=4)
            else:
                ax.plot([], [], ls, color=colors[r], alpha=0.35, label=f"{name} {codec} (predicted)")
    tc = [e for e in es if e["model"] == model and e["nodes"] == n and e.get("shaping") == "tc"
          and e["latency_ms_median"]]
    if tc:
        ax.plot([e["bandwidth_mbit"] for e in tc], [e["latency_ms_median"] for e in tc], "k^", ms=7, mfc="none",
                label="kernel tc (veth, netns)")


def plot_latency(data: dict, plot: Path) -> None:
    """Latency against link bandwidth (the big model, N=2 and N=4): markers measured, faint lines predicted."""
    from .plots import pyplot, save

    es = data["entries"]
    model = "resnet50" if any(e["model"] == "resnet50" for e in es) else es[0]["model"]
    loop_x = 10_000  # where "unshaped loopback" sits on the bandwidth axis
    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4.5), sharey=True)
    single = next((e for e in es if e["model"] == model and e["mode"] == "single"), None)
    for ax, n in zip(axes, (2, 4), strict=True):
        _plot_one(ax, es, model, n, loop_x)
        if single:
            ax.axhline(single["latency_ms_median"], color="k", ls=":", lw=1, label="1 process (PyTorch)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks([10, 100, 1000, loop_x], ["10", "100", "1000", "loopback"])
        ax.set_xlabel("link bandwidth per node (Mbit/s)")
        ax.set_title(f"{model}, N={n}: markers measured, faint lines predicted")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("latency per inference (ms)")
    axes[1].legend(fontsize=7, loc="upper right")
    save(fig, plot)
