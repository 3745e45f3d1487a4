"""One-way ping-pong of the node transports on loopback: disco_edge's ZeroMQ transport and torch's gloo.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.pingpong            # results/pingpong.json (about 20 s)
    .venv/bin/python -m bench.pingpong --no-gloo --iters 100          # ZeroMQ only

Two processes; rank 0 sends a message of S bytes, rank 1 sends it back; one way = round trip / 2 (median over
``--iters`` after ``--warmup``). The ZeroMQ side runs the engine's own ``ZmqTransport`` (hello, tags, size
check, zero-copy receive), so the figure is what a node pays per message.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time
from pathlib import Path
from typing import Any

from disco_edge.pingpong import free_ports
from disco_edge.pingpong import measure as measure_zmq

ROOT = Path(__file__).resolve().parents[1]
SIZES = (1024, 1 << 20)


def _gloo_worker(rank: int, port: int, size: int, iters: int, warmup: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    buf = torch.ones(size, dtype=torch.uint8)
    times = []
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        else:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        out.put(statistics.median(times) / 2)
    dist.barrier()
    dist.destroy_process_group()


def measure(kind: str, size: int, iters: int, warmup: int) -> float:
    """The median one-way time in seconds of ``kind`` ("zmq" or "gloo") for ``size``-byte messages."""
    if kind == "zmq":  # the engine's own transport (disco_edge.pingpong)
        return measure_zmq([size], iters, warmup)[0]["one_way_s"]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_ports(1)[0]
    args = [(r, port, size, iters, warmup, out) for r in (0, 1)]
    target = _gloo_worker
    procs = [ctx.Process(target=target, args=a) for a in args]
    for p in procs:
        p.start()
    t = out.get(timeout=120)
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    return t


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
           "host_cpus": len(__import__("os").sched_getaffinity(0)), "rows": rows}
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
