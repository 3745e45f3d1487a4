"""One-way ping-pong of the node transports on loopback: disco_edge's ZeroMQ transport and torch's gloo.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.pingpong            # results/pingpong.json (about 20 s)
    .venv/bin/python -m bench.pingpong --no-gloo --iters 100          # ZeroMQ only

Two processes; rank 0 sends a message of S bytes, rank 1 sends it back; one way = round trip / 2 (median over
``--iters``). Each side runs its engine's own transport: ZeroMQ the edge engine's ``ZmqTransport`` (hello, tags,
size check, zero-copy receive; ``disco_edge.pingpong``), gloo the torch node's ``DistTransport``
(``disco.runtime.latency.calibrate_delay``, the sweep's calibration), so each figure is what a node pays per message.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from disco_edge.pingpong import measure as measure_zmq

ROOT = Path(__file__).resolve().parents[1]
SIZES = (1024, 1 << 20)


def measure(kind: str, size: int, iters: int, warmup: int) -> float:
    """The median one-way time in seconds of ``kind`` ("zmq" or "gloo") for ``size``-byte messages."""
    if kind == "zmq":
        return measure_zmq([size], iters, warmup)[0]["one_way_s"]
    from disco.runtime.latency import calibrate_delay  # torch: imported only for the gloo side

    return calibrate_delay([size], reps=iters)[1]["one_way_s"][0]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--no-gloo", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "results" / "pingpong.json"))
    a = ap.parse_args(argv)
    rows = []
    for kind in ("zmq",) + (() if a.no_gloo else ("gloo",)):
        for size in SIZES:
            iters = a.iters if size <= 65536 else max(10, a.iters // 6)
            t = measure(kind, size, iters, a.warmup)
            rows.append({"transport": kind, "bytes": size, "one_way_ms": t * 1e3, "iters": iters})
    res = {"what": "one-way ping-pong on loopback (median round trip / 2), two processes",
           "host_cpus": len(os.sched_getaffinity(0)), "rows": rows}
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
