"""One-way ping-pong of the engine's ZeroMQ transport between two processes on this host (loopback).

    python -m disco_edge.pingpong --sizes 1024,262144 --iters 200 --modes unpaced,paced   # one JSON line

Rank 0 sends S bytes, rank 1 sends them back: one way = median round trip / 2 (after ``warmup`` rounds), and the
median CPU time of rank 0's ``send`` call (``send_s``: its thread's CPU time) and of rank 0's whole process per
message (``cpu_s``: half a round trip's, every thread's, the ZeroMQ I/O thread's work included). It runs the
node's own ``ZmqTransport`` (hello, tags, size check, zero-copy receive), so the figure is what a node pays per
message. ``paced``: every message goes through the pacing thread, which holds it for an emulated one-way latency of
``PACED_LATENCY_S`` (``link_s`` in the rows), as on a shaped link: what it adds beyond that is the thread's hand-off
and the sleep's overshoot. ``busy``: both ranks compute (``BUSY_WORK_S`` of work when alone) and then exchange, as
two nodes that compute at once do; the figure is each round's time less the work's (what busy cores add to a
message), and the rows add rank 0's work time alone (rank 1 waiting) and together (how much two processes computing
at once slow each other here). Used by ``disco plan --engine onnx`` and ``bench/edge.py --pingpong``.
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

MODES = ("unpaced", "paced", "busy")
PACED_LATENCY_S = 5e-4  # "paced" mode's emulated one-way latency: the pacer sleeps, as on a shaped link
BUSY_WORK_S = 2e-4  # "busy" mode: each rank's work per round (about, alone)


def _work(n: int) -> None:
    a = np.ones((32, 32), dtype=np.float32)
    for _ in range(n):
        a @ a


def _timed_work(n: int) -> float:
    t0 = time.perf_counter()
    _work(n)
    return time.perf_counter() - t0


def _busy_work(tr: Any, rank: int) -> tuple[int, float]:
    """(iterations of :func:`_work` that take about ``BUSY_WORK_S`` here, rank 0's median time for them while
    rank 1 waits: the work alone)."""
    n = max(1, int(200 * BUSY_WORK_S / max(_timed_work(200), 1e-9)))
    if rank == 1:
        tr.recv(0, 15, 1)
        return n, 0.0
    alone = statistics.median(_timed_work(n) for _ in range(20))
    tr.send(1, 15, np.zeros(1, dtype=np.uint8))
    return n, alone


def free_ports(n: int) -> list[int]:
    """``n`` TCP ports on 127.0.0.1 free a moment ago."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _worker(rank: int, peers: list[str], sizes: list[int], iters: int, warmup: int, mode: str, out: Any) -> None:
    from .link import LinkModel
    from .transport import ZmqTransport

    tr = ZmqTransport(rank, 2, "pingpong", LinkModel(None, PACED_LATENCY_S) if mode == "paced" else None, timeout=30)
    tr.start_peers(peers)
    n_work, alone = _busy_work(tr, rank) if mode == "busy" else (0, 0.0)
    rows = []
    for tag, size in enumerate(sizes, start=16):
        buf = np.ones(size, dtype=np.uint8)
        rtt, send, work, cpu = [], [], [], []
        for i in range(warmup + iters):
            t0 = time.perf_counter()
            w = _timed_work(n_work) if n_work else 0.0  # busy: both ranks work, then exchange
            if rank == 0 or n_work:
                p0, c0 = time.process_time(), time.thread_time()  # the send call's CPU (not the wait for a core)
                tr.send(1 - rank, tag, buf)
                c1 = time.thread_time()
                tr.recv(1 - rank, tag, size)
                if i >= warmup:
                    rtt.append(time.perf_counter() - t0 - w)
                    send.append(c1 - c0)
                    work.append(w)
                    cpu.append(time.process_time() - p0)  # every thread's: the I/O thread's work too
            else:
                tr.send(0, tag, tr.recv(0, tag, size).copy())
        if rank == 0:
            one_way = statistics.median(rtt) / (1 if n_work else 2)  # busy: each round is one way each
            rows.append({"bytes": size, "one_way_s": one_way, "send_s": statistics.median(send), "iters": iters,
                         "cpu_s": statistics.median(cpu) / 2, "link_s": PACED_LATENCY_S if mode == "paced" else 0.0})
            if n_work:
                rows[-1].update(work_alone_s=alone, work_together_s=statistics.median(work))
    tr.flush()
    if rank == 0:
        out.put(rows)
    else:
        time.sleep(0.5)  # the last reply leaves before the sockets close
    tr.close()


def measure(sizes: list[int], iters: int = 200, warmup: int = 20, mode: str = "unpaced",
            timeout: float = 120.0) -> list[dict[str, Any]]:
    """Per size: ``{"bytes", "one_way_s", "send_s", "iters"}`` from two fresh processes (``iters`` rounds after
    ``warmup``, in ``mode``: unpaced, paced or busy, see the module's docstring)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    peers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    procs = [ctx.Process(target=_worker, args=(r, peers, sizes, iters, warmup, mode, out), daemon=True)
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
    print(json.dumps({m: measure(sizes, a.iters, a.warmup, m) for m in modes}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
