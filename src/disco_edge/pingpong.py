"""One-way ping-pong of the engine's ZeroMQ transport between two processes on this host (loopback).

    python -m disco_edge.pingpong --sizes 1024,262144 --iters 200 --modes unpaced,paced   # one JSON line

Rank 0 sends S bytes, rank 1 sends them back: one way = median round trip / 2 (after ``warmup`` rounds), and the
median time of rank 0's ``send`` call (the sender's own CPU per message). It runs the node's own ``ZmqTransport``
(hello, tags, size check, zero-copy receive), so the figure is what a node pays per message. ``paced``: every
message goes through the pacing thread, as on an emulated link, at a bandwidth so high that the wire time is nil
(what remains is the thread's hand-off). Used by ``disco plan --engine onnx`` and ``bench/pingpong.py``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import statistics
import time
from typing import Any

import numpy as np

MODES = ("unpaced", "paced")
NIL_WIRE_BPS = 1e15  # "paced" mode's bandwidth: the pacer runs, the wire time is nil


def free_ports(n: int) -> list[int]:
    """``n`` TCP ports on 127.0.0.1 free a moment ago."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _worker(rank: int, peers: list[str], sizes: list[int], iters: int, warmup: int, paced: bool, out: Any) -> None:
    from .link import LinkModel
    from .transport import ZmqTransport

    tr = ZmqTransport(rank, 2, "pingpong", LinkModel(NIL_WIRE_BPS) if paced else None, timeout=30)
    tr.start_peers(peers)
    rows = []
    for tag, size in enumerate(sizes, start=16):
        buf = np.ones(size, dtype=np.uint8)
        rtt, send = [], []
        n = max(10, min(iters, iters * 65536 // size))  # large messages: fewer rounds
        for i in range(warmup + n):
            t0 = time.perf_counter()
            if rank == 0:
                tr.send(1, tag, buf)
                t1 = time.perf_counter()
                tr.recv(1, tag, size)
                if i >= warmup:
                    rtt.append(time.perf_counter() - t0)
                    send.append(t1 - t0)
            else:
                tr.send(0, tag, tr.recv(0, tag, size).copy())
        if rank == 0:
            rows.append({"bytes": size, "one_way_s": statistics.median(rtt) / 2, "send_s": statistics.median(send),
                         "iters": n})
    tr.flush()
    if rank == 0:
        out.put(rows)
    else:
        time.sleep(0.5)  # the last reply leaves before the sockets close
    tr.close()


def measure(sizes: list[int], iters: int = 200, warmup: int = 20, paced: bool = False,
            timeout: float = 120.0) -> list[dict[str, Any]]:
    """Per size: ``{"bytes", "one_way_s", "send_s", "iters"}`` from two fresh processes (messages over 64 KB get
    fewer rounds: at least 10, about ``iters`` x 64 KB in all)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    peers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    procs = [ctx.Process(target=_worker, args=(r, peers, sizes, iters, warmup, paced, out), daemon=True)
             for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        return out.get(timeout=timeout)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


def main(argv: list[str] | None = None) -> int:
    """Print one JSON object: mode -> the rows of :func:`measure`."""
    ap = argparse.ArgumentParser(prog="python -m disco_edge.pingpong", description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1024,262144", help="message sizes in bytes, comma-separated")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--modes", default="unpaced", help=f"comma-separated, of {', '.join(MODES)}")
    a = ap.parse_args(argv)
    sizes = sorted(int(s) for s in a.sizes.split(","))
    modes = [m for m in a.modes.split(",") if m]
    if not sizes or min(sizes) < 1 or a.iters < 1 or a.warmup < 0 or not set(modes) <= set(MODES):
        ap.error(f"positive --sizes, --iters >= 1, --warmup >= 0 and --modes among {', '.join(MODES)} please")
    print(json.dumps({m: measure(sizes, a.iters, a.warmup, m == "paced") for m in modes}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
