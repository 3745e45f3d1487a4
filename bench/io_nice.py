"""What ``--io-nice`` does: the same exports run with gloo's I/O threads at niceness 0 and 19, alternating.

    OMP_NUM_THREADS=1 .venv/bin/python bench/io_nice.py            # results/io_nice.json
    OMP_NUM_THREADS=1 .venv/bin/python bench/io_nice.py --quick    # CIFAR ResNet-20 only, 2 rounds

gloo's event loop (one thread per process) polls a connection while the main thread holds that
connection's lock: at equal priority it takes a core from the node processes, which on a host with
fewer cores than busy threads delays the compute and the other node's sends. Each setting is an
export of ``bench/latency.py`` (random init, one-shot global magnitude selection), run on loopback
(unshaped) with ``disco run``'s launcher, 1 torch thread per node; the two niceness values alternate
so that a drift of the host's speed hits both. Reported: every run's median latency and the median
over the rounds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from host import host_state, wait_idle  # noqa: E402
from latency import Prepared  # noqa: E402

from disco.runtime.launch import launch  # noqa: E402
from disco.runtime.options import RunOptions  # noqa: E402

OUT = ROOT / "results" / "io_nice.json"
# (model, N, ratios, rounds, timed inferences per run)
SETTINGS = [("cifar_resnet20", 2, (1.0, 0.1, 0.0), 4, 200), ("cifar_resnet20", 4, (1.0,), 2, 100),
            ("resnet50", 2, (1.0, 0.1, 0.0), 1, 30)]
NICE = (0, 19)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CIFAR ResNet-20 N=2 only, 2 rounds")
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args()
    settings = [("cifar_resnet20", 2, (1.0, 0.1, 0.0), 2, 200)] if a.quick else SETTINGS
    rows = []
    for name, n, ratios, rounds, iters in settings:
        prep = Prepared(name, n)
        for r in ratios:
            d = prep.export_dir(r)
            runs: dict[int, list[float]] = {v: [] for v in NICE}
            for _ in range(rounds):
                for v in NICE:
                    wait_idle(time.monotonic() + 600)
                    rep = launch(d, n, RunOptions(iters=iters, warmup=10, io_nice=v, timeout=120,
                                                  startup_timeout=60))
                    runs[v].append(round(rep["latency_ms_median"], 3))
                    print(f"{name} N={n} r={r:g} io_nice={v}: {runs[v][-1]:.2f} ms", flush=True)
            rows.append({"model": name, "nodes": n, "ratio_target": r, "iters": iters, "runs_ms": runs,
                         "median_ms": {v: float(np.median(runs[v])) for v in NICE}, **host_state()})
    out = {"method": __doc__.strip(), "command": "OMP_NUM_THREADS=1 .venv/bin/python bench/io_nice.py"
           + (" --quick" if a.quick else ""), "entries": rows}
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.out}")
    for row in rows:
        m = row["median_ms"]
        print(f"{row['model']:15s} N={row['nodes']} r={row['ratio_target']:<4g} io_nice 0: {m[0]:7.2f} ms   "
              f"19: {m[19]:7.2f} ms   ({m[19] / m[0]:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
