"""Latency benchmark: one process vs dense within-layer parallelism vs DISCO vs separated branches.

    .venv/bin/python bench/latency.py --quick          # cifar_resnet8, N=2, a few settings (minutes)
    .venv/bin/python bench/latency.py                  # the full sweep of issue 3 (resnet50 too: hours on 2 cores)

Writes results/latency.json (one entry per measurement), results/latency.png (latency against
bandwidth) and the table in bench/README.md, generated from the JSON.

Link model (shared with the runtime's pacing, see disco.runtime.transport): each node's
interface is limited to the bandwidth, full duplex, all nodes behind one switch, a fixed
one-way latency per message. The latency model below predicts, without overlap:

    compute:  t_single * max_j FLOPs_j / FLOPs_dense          (per-node share of the measured 1-process time)
    per exchange (one base tensor): max over nodes of (bytes it sends, bytes it receives) * 8 / bw + latency
    input distribution and output gather: the same rule
Kept sets are random links at the byte budget r (accuracy is not the point of this benchmark).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from disco.cost import estimate  # noqa: E402
from disco.graph import partition  # noqa: E402
from disco.masks import DiscoModel  # noqa: E402
from disco.models import build_model  # noqa: E402
from disco.runtime.export import export  # noqa: E402
from disco.runtime.launch import launch  # noqa: E402
from disco.runtime.transport import get_codec  # noqa: E402


def kept_at(part, r: float, seed: int = 0) -> np.ndarray:  # noqa: ANN001
    """Random links whose values add up to at most r of the dense ones."""
    if r >= 1:
        return part.all_links()
    kept = part.no_links()
    budget = r * part.dense_values()
    total = 0
    for i in np.random.default_rng(seed).permutation(part.n_links):
        v = part.links.values[i]
        if total + v <= budget:
            kept[i] = True
            total += v
    return kept


def predict_ms(part, kept, t_single_ms: float, bw_bps: float | None, lat_s: float, bpv: int) -> float:  # noqa: ANN001
    rep = estimate(part, kept)
    n = part.nodes
    compute = t_single_ms * max(rep.flops_per_node) / max(1, rep.flops_dense)
    if bw_bps is None and lat_s == 0:
        return compute
    L = part.links
    comm = 0.0
    for t_idx, t_name in enumerate(part.link_tensors):
        sel = kept & (L.tensor == t_idx)
        if not sel.any():
            continue
        src = part.owner[t_name][L.channel[sel]]
        vals = L.values[sel] * bpv
        up = np.bincount(src, weights=vals, minlength=n)
        down = np.bincount(L.receiver[sel], weights=vals, minlength=n)
        comm += (max(up.max(), down.max()) * 8 / bw_bps if bw_bps else 0) + lat_s
    io = rep.input_bytes * 1.0  # leader uplink
    comm += (io * 8 / bw_bps if bw_bps else 0) + lat_s
    comm += (rep.output_bytes * 8 / bw_bps if bw_bps else 0) + lat_s
    return compute + comm * 1e3


def single_ms(model, x, iters: int) -> float:  # noqa: ANN001
    torch.set_num_threads(1)
    with torch.no_grad():
        for _ in range(2):
            model(x)
        ts = []
        for _ in range(iters):
            t0 = time.perf_counter()
            model(x)
            ts.append(time.perf_counter() - t0)
    return float(np.median(ts) * 1e3)


def run(models, nodes_list, ratios, codecs, bandwidths, iters, warmup, out_json, quick) -> list[dict]:  # noqa: ANN001
    entries: list[dict] = []
    for name, shape in models:
        torch.manual_seed(0)
        model = build_model(name)
        x = torch.randn(shape)
        t1 = single_ms(model, x, iters)
        n_params = sum(p.numel() for p in model.parameters())
        import resource

        entries.append({"model": name, "input_shape": list(shape), "mode": "single", "nodes": 1, "ratio": None,
                        "codec": None, "bandwidth_mbit": None, "shaping": None, "latency_ms_median": t1,
                        "predicted_ms": t1, "bytes_sent_total": 0,
                        "peak_rss_mb_per_node": [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024],
                        "weight_bytes_per_node": [n_params * 4], "max_rel_err_vs_single_process": 0.0})
        print(json.dumps(entries[-1]), flush=True)
        for n in nodes_list:
            part = partition(model, x, n)
            for r in ratios:
                kept = kept_at(part, r)
                mode = "dense" if r >= 1 else "separated" if r == 0 else "disco"
                dm = DiscoModel(model, part, kept)
                with tempfile.TemporaryDirectory() as d:
                    export(dm, part, kept, d, {"name": name, "kwargs": {}}, probe=x)
                    for codec in codecs:
                        for bw in bandwidths:
                            opts = ["--codec", codec, "--iters", str(iters), "--warmup", str(warmup), "--timeout",
                                    "60"]
                            if bw is not None:
                                opts += ["--bandwidth", f"{bw}mbit"]
                            rep = launch(d, n, opts, timeout=3600)
                            bpv = get_codec(codec).bytes_per_value
                            e = {"model": name, "input_shape": list(shape), "mode": mode, "nodes": n,
                                 "ratio": round(part.ratio(kept), 4), "codec": codec, "bandwidth_mbit": bw,
                                 "shaping": "pacing" if bw is not None else None,
                                 "latency_ms_median": rep["latency_ms_median"],
                                 "predicted_ms": predict_ms(part, kept, t1, None if bw is None else bw * 1e6, 0.0, bpv),
                                 "bytes_sent_total": rep["bytes_sent_total"], "bytes_predicted": rep["bytes_predicted"],
                                 "peak_rss_mb_per_node": rep["peak_rss_mb_per_node"],
                                 "weight_bytes_per_node": rep["weight_bytes_per_node"],
                                 "weight_fraction_max": max(rep["params_per_node"]) / rep["params_dense"],
                                 "max_rel_err_vs_single_process": rep["max_rel_err_vs_single_process"],
                                 "iters": iters}
                            entries.append(e)
                            print(json.dumps(e), flush=True)
                dm = None
                from torch.nn.utils import parametrize

                for ly in part.layers:  # unwrap the masks before the next kept set
                    parametrize.remove_parametrizations(model.get_submodule(ly.name), "weight",
                                                        leave_parametrized=False)
    meta = {"quick": quick, "link_model": "per-node interface limited to the bandwidth, full duplex, one switch; "
            "pacing emulation (no tc)", "threads_per_node": 1, "host_cpus": __import__("os").cpu_count(),
            "note": "2-core host shared with a training job: N processes share 2 cores, so compute does not "
                    "parallelise here; resnet50 and tc shaping not run" if quick else ""}
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps({"meta": meta, "entries": entries}, indent=1))
    return entries


def write_outputs(out_json: Path, readme: Path, plot: Path) -> None:
    data = json.loads(out_json.read_text())
    rows = ["| model | mode | N | r | codec | Mbit/s | measured ms | predicted ms | bytes sent | weights/node (max) "
            "| rel. err |", "|" + "---|" * 11]
    for e in data["entries"]:
        bw = "loopback" if e["bandwidth_mbit"] is None else f"{e['bandwidth_mbit']:g}"
        err = e.get("max_rel_err_vs_single_process")
        rows.append(f"| {e['model']} | {e['mode']} | {e['nodes']} | {e['ratio'] if e['ratio'] is not None else '-'} "
                    f"| {e['codec'] or '-'} | {bw} | {e['latency_ms_median']:.2f} | {e['predicted_ms']:.2f} "
                    f"| {e['bytes_sent_total']} | {max(e['weight_bytes_per_node']) / 1e6:.3f} MB "
                    f"| {'-' if err is None else f'{err:.1e}'} |")
    text = readme.read_text() if readme.is_file() else "# Benchmarks\n"
    start, end = "<!-- latency-table -->", "<!-- /latency-table -->"
    table = f"{start}\n_Generated by `bench/latency.py` from results/latency.json; {json.dumps(data['meta'])}_\n\n" \
        + "\n".join(rows) + f"\n{end}"
    if start in text:
        text = text[:text.index(start)] + table + text[text.index(end) + len(end):]
    else:
        text += "\n" + table + "\n"
    readme.write_text(text)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    groups: dict[tuple, list] = {}
    for e in data["entries"]:
        if e["mode"] == "single" or e["bandwidth_mbit"] is None:
            continue
        groups.setdefault((e["model"], e["mode"], e["nodes"], e["ratio"], e["codec"]), []).append(e)
    for k, es in groups.items():
        es.sort(key=lambda e: e["bandwidth_mbit"])
        ax.plot([e["bandwidth_mbit"] for e in es], [e["latency_ms_median"] for e in es], "o-",
                label=f"{k[0]} {k[1]} N={k[2]} r={k[3]} {k[4]}")
        ax.plot([e["bandwidth_mbit"] for e in es], [e["predicted_ms"] for e in es], "x--", alpha=0.5)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("link bandwidth (Mbit/s)")
    ax.set_ylabel("latency (ms), o measured, x predicted")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(plot, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=str(ROOT / "results" / "latency.json"))
    a = p.parse_args()
    out = Path(a.out)
    if a.quick:
        run([("cifar_resnet8", (1, 3, 32, 32))], [2], [1.0, 0.2, 0.0], ["fp32"], [100, None], 20, 3, out, True)
    else:
        run([("cifar_resnet20", (1, 3, 32, 32)), ("resnet50", (1, 3, 224, 224))], [2, 4],
            [1.0, 0.2, 0.1, 0.05, 0.0], ["fp32", "fp16"], [10, 100, 1000, None], 20, 3, out, False)
    write_outputs(out, ROOT / "bench" / "README.md", out.with_suffix(".png"))


if __name__ == "__main__":
    main()
