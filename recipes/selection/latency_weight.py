"""Charging every message kept (``--latency-weight``) on a high-latency link: predicted latency, same bytes.

ResNet-50 (random init, magnitude links as ``disco cost`` picks them), N nodes, r = 0.2, global budget,
with and without a charge of latency x bandwidth bytes per message; each kept set's node programs are
traced (disco.runtime.latency.trace_plan, 1 thread) and replayed through the latency model on a link of
the given bandwidth and one-way latency (one core per node; per-message delay from results/latency.json).
``predicted_ms_communication_only`` replays the same programs with every compute segment removed: the
part that the kept set's messages decide, independent of how loaded the machine was while tracing.
With ``--measure`` each kept set is also exported and run as N processes on the emulated link (``disco
export MODEL --latency-weight B`` then ``disco run --bandwidth --latency``): ``measured_ms`` is the median.

    OMP_NUM_THREADS=1 nice -n 10 python recipes/selection/latency_weight.py --measure   # -> results/latency_weight.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from disco.cost import estimate
from disco.graph import partition
from disco.masks import DiscoModel
from disco.models import build_model
from disco.runtime import latency as lat
from disco.runtime.transport import LinkModel
from disco.sparsify import magnitude_scores, select_links

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--ratio", type=float, default=0.2)
    p.add_argument("--mbit", type=float, default=50.0)
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--weights", default="1,0.25,4", help="latency weights as multiples of latency x bandwidth")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--measure", action="store_true", help="also export and run each kept set (disco run)")
    p.add_argument("--iters", type=int, default=5, help="--measure: timed inferences per run")
    p.add_argument("--out", default=str(ROOT / "results" / "latency_weight.json"))
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    shape = (1, 3, 224, 224) if a.model == "resnet50" else (1, 3, 32, 32)
    model = build_model(a.model).eval()
    part = partition(model, shape, a.nodes)
    scores = magnitude_scores(DiscoModel(model, part))
    link = LinkModel(a.mbit * 1e6, a.latency_ms / 1e3)
    meta = json.loads((ROOT / "results" / "latency.json").read_text())["meta"]
    d = meta.get("delay_loaded_paced", meta["delay"])
    delay = lat.Delay(d["a_s"], d["b_s_per_byte"])
    per_message = a.latency_ms / 1e3 * a.mbit * 1e6 / 8  # bytes the link could move during one latency
    x = torch.randn(shape)
    rows = []
    for mult in [0.0] + [float(m) for m in a.weights.split(",")]:
        kept = select_links(part, scores, a.ratio, "global", latency_weight=mult * per_message / 4)
        rep = estimate(part, kept)
        progs = lat.trace_plan(part, kept, x, reps=a.reps, warmup=1)
        pred = lat.predict(progs, link, a.nodes, delay)
        comm = lat.predict([[st for st in pr if st[0] != "c"] for pr in progs], link, a.nodes, delay)
        rows.append({"model": a.model, "nodes": a.nodes, "target_ratio": a.ratio, "ratio": rep.ratio,
                     "bandwidth_mbit": a.mbit, "latency_ms": a.latency_ms,
                     "latency_weight_bytes": mult * per_message, "latency_weight_x": mult,
                     "messages_per_inference": rep.messages_per_inference, "messages_traced": pred["messages"],
                     "bytes": rep.bytes, "predicted_ms": round(pred["predicted_ms"], 1),
                     "predicted_ms_no_overlap": round(pred["predicted_ms_no_overlap"], 1),
                     "predicted_ms_communication_only": round(comm["predicted_ms"], 1),
                     "compute_ms_per_node": [round(c, 1) for c in pred["compute_ms_per_node"]]})
        if a.measure:
            rows[-1].update(measure(a, mult * per_message, rep))
        print(json.dumps(rows[-1]), flush=True)
    Path(a.out).write_text(json.dumps(rows, indent=1) + "\n")


def measure(a: argparse.Namespace, latency_weight: float, rep: object) -> dict:
    """Export the same kept set (``disco export MODEL --latency-weight``) and run it on the emulated link."""
    import os
    import tempfile

    import disco
    from disco.api import export_model_name

    with tempfile.TemporaryDirectory(prefix="disco-lw-") as d:
        man = export_model_name(a.model, d, a.nodes, a.ratio, None, latency_weight=latency_weight)
        assert abs(man["ratio"] - rep.ratio) < 1e-9, "the export kept other links than the estimate"
        r = disco.run(d, a.nodes, bandwidth=f"{a.mbit:g}mbit", latency=f"{a.latency_ms:g}ms", iters=a.iters,
                      warmup=1)
    return {"measured_ms": round(r["latency_ms_median"], 1), "measured_ms_all": [round(x, 1) for x in
            r["latency_ms_all"]], "messages_measured": r["messages_per_inference"],
            "bytes_sent": r["bytes_sent_total"], "bytes_predicted": r["bytes_predicted"],
            "loadavg_1min": os.getloadavg()[0]}


if __name__ == "__main__":
    main()
