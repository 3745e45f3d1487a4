"""Memory soak: a long ``--stream`` run, each node's RSS sampled along the stream; is it flat after warm-up?

    OMP_NUM_THREADS=1 python -m bench.soak                      # 2,000 inferences, --stream 8, N=2 -> results/soak.json
    python -m bench.soak --iters 300 --out /tmp/soak.json      # a quick look

``cifar_resnet8`` over N nodes, a random 30% of its links kept; each node samples its RSS 40 times along the stream.
A node is flat when every sample after the first ``--warmup-fraction`` stays within ``--tolerance`` of the first
of them; ``growth_kb_per_inference`` is the least-squares slope over those samples.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.faults import make_export

ROOT = Path(__file__).resolve().parents[1]


def node_summary(samples: list[float], iters: int, warmup_fraction: float, tol: float) -> dict:
    k = max(1, int(len(samples) * warmup_fraction))
    post = np.asarray(samples[k:])
    base = float(post[0])
    x = np.linspace(warmup_fraction * iters, iters, len(post))
    slope_mb = float(np.polyfit(x, post, 1)[0]) if len(post) > 1 else 0.0
    dev = float(np.max(np.abs(post - base)) / base)
    return {"rss_mb_after_warmup": base, "rss_mb_end": float(post[-1]), "rss_mb_max": float(post.max()),
            "max_deviation_pct": round(100 * dev, 2), "growth_kb_per_inference": round(slope_mb * 1024, 3),
            "flat": dev <= tol, "samples_mb": samples}


def _args_but_out(argv: list[str]) -> list[str]:
    """``argv`` without its ``--out PATH`` or ``--out=PATH``."""
    value = {i + 1 for i, a in enumerate(argv) if a == "--out"}
    return [a for i, a in enumerate(argv) if i not in value and a != "--out" and not a.startswith("--out=")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--stream", type=int, default=8)
    ap.add_argument("--bandwidth", default=None, help="also pace the link, e.g. 1gbit")
    ap.add_argument("--warmup-fraction", type=float, default=0.25)
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--out", default=str(ROOT / "results" / "soak.json"))
    args = ap.parse_args()

    from disco.runtime.launch import launch
    from disco.runtime.options import RunOptions

    with tempfile.TemporaryDirectory(prefix="disco-soak-") as tmp:
        make_export(Path(tmp), nodes=args.nodes)
        opts = RunOptions(warmup=3, iters=args.iters, stream=args.stream, bandwidth=args.bandwidth, timeout=60)
        t0 = time.monotonic()
        rep = launch(tmp, args.nodes, opts, timeout=3600)
        wall = time.monotonic() - t0
    nodes = [node_summary(s, args.iters, args.warmup_fraction, args.tolerance) for s in rep["rss_mb_stream_per_node"]]
    out = {"model": rep["model"], "nodes": args.nodes, "inferences": args.iters, "stream": args.stream,
           "bandwidth": args.bandwidth, "warmup_fraction": args.warmup_fraction, "tolerance": args.tolerance,
           "flat": all(n["flat"] for n in nodes), "per_node": nodes,
           "throughput_per_s": rep["throughput_per_s"], "wall_s": round(wall, 1),
           "command": " ".join(["python -m bench.soak", *_args_but_out(sys.argv[1:])]),
           "host": {"python": platform.python_version(), "torch": torch.__version__}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for j, n in enumerate(nodes):
        print(f"node {j}: RSS {n['rss_mb_after_warmup']:.1f} MB after warm-up -> {n['rss_mb_end']:.1f} MB at the end "
              f"(max deviation {n['max_deviation_pct']:.2f}%, slope {n['growth_kb_per_inference']:+.3f} KB/inference)"
              f" {'flat' if n['flat'] else 'GROWS'}")
    return 0 if out["flat"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
