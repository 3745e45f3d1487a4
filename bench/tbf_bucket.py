"""Check the latency model's tbf bucket: the CIFAR tc entries, measured with the sweep's bucket and a small one.

    OMP_NUM_THREADS=1 .venv/bin/python bench/tbf_bucket.py      # root and iproute2; ~2 min; results/tbf_bucket.json

The fit's tc prediction (bench/latency_fit.py) lets a message's first bytes leave at once when tbf's bucket
has refilled (``replay(..., burst_bytes=)``); the bucket's size is no parameter of the fit. If the bucket is
what makes the CIFAR tc entries fast, a bucket of two frames must slow them down by what the model says,
with the same calibration. Each CIFAR ResNet-20 tc setting of results/latency.json (N=2, 100 Mbit/s, fp32;
export: random init, magnitude links, as `disco export` does) is launched alternately with each bucket; the
prediction uses the entry's compute trace from results/latency.json and the committed calibration
(disco.planner's defaults).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import latency_fit as lf  # noqa: E402
import netns  # noqa: E402

from disco import planner  # noqa: E402

OUT = ROOT / "results" / "tbf_bucket.json"
BW = 100  # Mbit/s, as the sweep's CIFAR tc entries


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bursts", default=f"{netns.tbf_burst(BW)},2048", help="bucket sizes in bytes")
    ap.add_argument("--launches", type=int, default=3, help="launches per (setting, bucket), alternating")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    why = netns.netns_check()
    if why:
        print(f"cannot shape a veth here: {why}", file=sys.stderr)
        return 2
    _, multi, _ = lf.entries()
    todo = [e for e in multi if e["shaping"] == "tc" and e["model"] == "cifar_resnet20" and e["bandwidth_mbit"] == BW]
    feats = lf.build_features(todo, ["cifar_resnet20"])
    bursts = [int(b) for b in a.bursts.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="disco-tbf-") as tmp:
        for e in todo:
            d = Path(tmp) / f"r{e['ratio_target']}"
            subprocess.run([sys.executable, "-m", "disco.cli", "export", "cifar_resnet20", "--nodes", "2", "--ratio",
                            str(e["ratio_target"]), "--out", str(d)], check=True, capture_output=True)
            measured: dict[int, list[float]] = {b: [] for b in bursts}
            for _ in range(a.launches):
                for b in bursts:
                    rep = netns.launch_tc(d, BW, ["--codec", e["codec"], "--iters", "100", "--warmup", "10",
                                                  "--timeout", "120", "--threads", "1"], timeout=300, burst=b)
                    measured[b].append(round(rep["latency_ms_median"], 3))
                    print(lf.key(e), b, measured[b][-1], flush=True)
            cal = planner.Calibration()  # the fit's tc prediction (lf.predict_entry) on the committed calibration
            pred = {b: round(lf.predict_entry(e, feats, cal, True, b), 3) for b in [*bursts, 0]}
            rows.append({"key": lf.key(e), "sweep_measured_ms": round(e["latency_ms_median"], 3),
                         "buckets": [{"burst_bytes": b, "measured_ms": measured[b], "predicted_ms": pred[b]}
                                     for b in bursts],
                         "predicted_ms_without_bucket": pred[0]})
    out = {"method": __doc__.strip(), "bandwidth_mbit": BW, "entries": rows}
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
