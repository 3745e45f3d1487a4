"""Do two plain forward passes slow each other down on this host? (What the latency model's ``corun`` is not.)

    .venv/bin/python bench/corun_probe.py      # ~2 min; results/corun_probe.json

For each model: one process alone runs the whole model's forward pass on 1 thread for ``--seconds``, then two
such processes at once, then one alone again; the median time of one pass of each. The latency model's fitted
``corun`` (0.85: each node 1.18x slower while both compute) is compared with the pair's slowdown here: if the
plain passes do not slow each other, the runs' slowdown comes from what the node runtime adds while both nodes
compute (its transport threads, gloo's I/O threads), not from the models sharing the cores' caches.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "corun_probe.json"
MODELS = ("deit_small_patch16_224", "resnet50")  # input shapes: the latency sweep's (bench/latency.py)


def one(name: str, seconds: float) -> None:
    """Child: print the median ms of one forward pass of ``name`` over ``seconds``."""
    import torch

    sys.path.insert(0, str(ROOT / "src"))
    sys.path.insert(0, str(ROOT / "bench"))
    from latency import SHAPES

    from disco.models import build_model

    torch.set_num_threads(1)
    m, x = build_model(name).eval(), torch.randn(SHAPES[name])
    ts = []
    with torch.no_grad():
        for _ in range(3):
            m(x)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            m(x)
            ts.append(time.perf_counter() - t0)
    print(json.dumps({"median_ms": statistics.median(ts) * 1e3, "passes": len(ts)}))


def run(name: str, seconds: float, together: int) -> list[float]:
    cmd = [sys.executable, __file__, "--child", name, "--seconds", str(seconds)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(together)]
    return [round(json.loads(p.communicate()[0])["median_ms"], 2) for p in procs]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--child")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    if a.child:
        one(a.child, a.seconds)
        return 0
    rows = []
    for name in a.models.split(","):
        alone = run(name, a.seconds, 1) + run(name, a.seconds, 1)  # before and after the pair
        pair = run(name, a.seconds, 2)
        rows.append({"model": name, "alone_ms": alone, "pair_ms": pair,
                     "pair_slowdown": round(statistics.mean(pair) / statistics.mean(alone), 3)})
        print(rows[-1], flush=True)
    out = {"method": __doc__.strip(), "threads": 1, "seconds": a.seconds, "entries": rows}
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
