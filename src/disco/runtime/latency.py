"""Latency model: predicts what ``disco run`` measures, from measured per-node compute and the link model.

The model has three calibrated parts and one stated assumption:

* **per-node compute, measured at zero communication cost**: node j's plan runs alone in
  this process (1 thread) over a :class:`TraceTransport` whose receives return at once;
  the transport records when node j sends each message and when it first waits for each
  received one. The gaps between those events are node j's compute segments (its real
  kernels, split GEMMs, codec casts, index_select/cat and Python per-op overhead).
* **per-message delivery delay** ``d(S) = a + b*S`` (software + loopback copy of S bytes),
  fitted once on a gloo ping-pong between two processes through the runtime's own
  :class:`~disco.runtime.transport.DistTransport` (:func:`pingpong`); a second fit goes
  through the pacing thread (at a bandwidth too high to matter) for paced links.
* **the link model** of :mod:`disco.runtime.transport` (the one its pacing implements):
  every node's interface is limited to the bandwidth, full duplex, all nodes behind one
  non-blocking switch; a message of S bytes holds the sender's uplink for 8S/bw (FIFO),
  is released after the one-way latency, and holds the receiver's downlink for 8S/bw.
* **per-message runtime overhead on unshaped links** ``o``: CPU time after each received
  message that the ping-pong does not show (gloo progress and wake-ups while both
  processes compute); calibrated once so that the model reproduces one unshaped loopback
  run (the benchmark uses resnet50, dense, N=2, fp32), then applied to every unshaped run.
* **CPU**: the N node processes share ``cores`` cores (processor sharing): while k nodes
  compute at once, each runs at min(1, cores/k) of its single-core speed.

:func:`replay` replays the N per-node traces against each other through that link model
(discrete events): a mixing op's local half runs before it waits for the remote channels,
exactly as the executor does, so this is the prediction *with overlap*.
:func:`no_overlap` is the bound without any overlap: compute (shared cores) plus, for each
exchange in turn, the busiest interface's bytes / bandwidth + latency + d(S).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .transport import Codec, LinkModel, get_codec

# a program step: ("c", seconds) | ("s", dst, tag, nbytes) | ("w", src, tag, nbytes) | ("f",)
Step = tuple


# ---- tracing one node's plan at zero communication cost ---------------------------------------

class _TraceHandle:
    def __init__(self, tr: TraceTransport, src: int, tag: int, shape: tuple[int, ...], cdim: int, codec: Codec,
                 nbytes: int) -> None:
        self.tr, self.src, self.tag, self.shape, self.cdim, self.codec, self.nbytes = \
            tr, src, tag, shape, cdim, codec, nbytes
        self._val: Tensor | None = None

    def wait(self) -> Tensor:
        if self._val is None:
            self.tr.events.append((time.perf_counter(), "w", self.src, self.tag, self.nbytes))
            self._val = self.codec.decode(torch.zeros(self.nbytes, dtype=torch.uint8), self.shape, self.cdim)
        return self._val


class TraceTransport:
    """Executor transport that delivers zeros at once and records when messages are sent and awaited."""

    def __init__(self, rank: int, codec: str | Codec = "fp32", cdims: dict[int, int] | None = None) -> None:
        self.rank = rank
        self.codec = codec if isinstance(codec, Codec) else get_codec(codec)
        self.raw = Codec()
        self.cdims = cdims or {}
        self.events: list[tuple] = []

    def send(self, tag: int, dst: int, t: Tensor, links: np.ndarray | None = None, coded: bool = True,
             stats: bool = False) -> None:
        cdim = self.cdims.get(tag, 1 if t.dim() > 1 else 0)
        buf = (self.codec if coded else self.raw).encode(t, cdim)  # the encode cost is part of compute
        self.events.append((time.perf_counter(), "s", dst, tag, int(buf.numel())))

    def recv(self, tag: int, src: int, shape: tuple[int, ...], coded: bool = True) -> _TraceHandle:
        cdim = self.cdims.get(tag, 1 if len(shape) > 1 else 0)
        codec = self.codec if coded else self.raw
        return _TraceHandle(self, src, tag, shape, cdim, codec, codec.nbytes(shape, cdim))

    def flush(self) -> None:
        self.events.append((time.perf_counter(), "f"))


def trace_plan(part: Any, kept: np.ndarray | None, x: Tensor, codec: str = "fp32", reps: int = 5,
               warmup: int = 2, ranks: Sequence[int] | None = None) -> list[list[Step]]:
    """Per node: its program (compute segments, sends, waits, flush) measured with 1 thread.

    Each node runs ``warmup + reps`` times alone; every segment is the median over the reps.
    """
    from .executor import Executor
    from .plan import RankPlan

    kept = part.all_links() if kept is None else np.asarray(kept, dtype=bool)
    progs: list[list[Step]] = []
    for j in (range(part.nodes) if ranks is None else ranks):
        plan = RankPlan(part, kept, j)
        weights, _ = plan.shard_from(part.gm)
        tr = TraceTransport(j, codec, {ex.tag: ex.cdim for ex in plan.exchanges.values()})
        ex = Executor(plan, part.gm, weights, tr)
        runs: list[list[float]] = []
        kinds: list[tuple] | None = None
        for k in range(warmup + reps):
            tr.events = []
            t0 = time.perf_counter()
            ex.run([x] if j == 0 else None)
            t1 = time.perf_counter()
            if k < warmup:
                continue
            kinds = [e[1:] for e in tr.events]
            runs.append([e[0] - t0 for e in tr.events] + [t1 - t0])
        med = np.median(np.asarray(runs), axis=0)
        med = np.maximum.accumulate(med)
        prog: list[Step] = []
        prev = 0.0
        for t, kind in zip(med[:-1], kinds or [], strict=True):
            if t > prev:
                prog.append(("c", float(t - prev)))
            prev = max(prev, float(t))
            prog.append(tuple(kind))
        if med[-1] > prev:
            prog.append(("c", float(med[-1] - prev)))
        progs.append(prog)
        del ex, weights
    return progs


def with_overhead(progs: list[list[Step]], recv_s: float) -> list[list[Step]]:
    """The programs with ``recv_s`` seconds of CPU work after every wait (per-message runtime overhead)."""
    if recv_s <= 0:
        return progs
    return [[x for s in p for x in ((s, ("c", recv_s)) if s[0] == "w" else (s,))] for p in progs]


def compute_s(prog: list[Step]) -> float:
    return float(sum(s[1] for s in prog if s[0] == "c"))


def messages(progs: list[list[Step]]) -> int:
    return sum(1 for p in progs for s in p if s[0] == "s")


# ---- the model ----------------------------------------------------------------------------------

@dataclass
class Delay:
    """Delivery delay of one message of S bytes once it leaves the (paced) sender: a + b*S seconds."""

    a: float = 100e-6
    b: float = 0.0

    def __call__(self, nbytes: int) -> float:
        return self.a + self.b * nbytes


class _Replay:
    """The state of one replay (see :func:`replay`): each node's position, status and pending wake-up, each
    sender's link and tbf bucket, the messages sent and waited for."""

    def __init__(self, progs: list[list[Step]], link: LinkModel, cores: int, delay: Delay, wake_s: float,
                 burst_bytes: float, busy_s: float) -> None:
        n = len(progs)
        self.progs, self.link, self.cores, self.delay, self.n = progs, link, cores, delay, n
        self.wake_s, self.burst_bytes, self.busy_s, self.bw = wake_s, burst_bytes, busy_s, link.bandwidth_bps
        self.idx = [0] * n
        self.status = ["new"] * n  # new (not stepped yet) | run | wait | done
        self.rem = [0.0] * n
        self.wake: list[float | None] = [None] * n
        self.tx_free = [0.0] * n
        self.last_out = [0.0] * n
        self.rx_free = [-1e9] * n
        self.tokens = [(float(burst_bytes), 0.0)] * n  # each sender's bucket: (level, at time)
        self.arrivals: dict[tuple, float] = {}  # (src, dst, tag, k) -> arrival time
        self.sent_count: dict[tuple, int] = {}
        self.wait_count: dict[tuple, int] = {}
        self.waiting: dict[tuple, tuple[int, float, int]] = {}  # key -> (node, time it started waiting, nbytes)
        self.end = [0.0] * n
        self.t = 0.0

    def bucket(self, j: int, start: float, nbytes: int) -> float:
        """When the last of ``nbytes``, the first of them leaving at ``start``, has left node j's tbf."""
        level, at = self.tokens[j]
        level = min(self.burst_bytes, level + (start - at) * self.bw / 8.0)
        free = min(level, nbytes)
        done = start + (nbytes - free) * 8.0 / self.bw
        self.tokens[j] = (level - free, done)
        return done

    def downlink(self, j: int, t_wait: float, arr: float, nbytes: int) -> float:
        done = max(t_wait, arr)
        if self.bw is None or self.burst_bytes:
            return done
        avail = max(done, self.rx_free[j] + nbytes * 8.0 / self.bw)
        self.rx_free[j] = avail
        return avail

    def send(self, j: int, dst: int, tag: int, nb: int) -> None:
        k = self.sent_count.get((j, dst, tag), 0)
        self.sent_count[(j, dst, tag)] = k + 1
        if self.link.shaped:
            start = max(self.t, self.tx_free[j])
            self.tx_free[j] = self.bucket(j, start, nb) if self.burst_bytes and self.bw \
                else start + self.link.wire_time(nb)
            release = self.tx_free[j] + self.link.latency_s
        else:
            release = self.t
        if self.busy_s and sum(1 for i in range(self.n) if i != j and self.status[i] == "run") + 1 >= self.cores:
            release += self.busy_s
        arr = release + self.delay(nb)
        self.last_out[j] = max(self.last_out[j], arr)
        key = (j, dst, tag, k)
        self.arrivals[key] = arr
        if key in self.waiting:
            node, t_wait, nbytes = self.waiting.pop(key)
            self.wake[node] = self.downlink(node, t_wait, arr + self.wake_s, nbytes)

    def wait(self, j: int, src: int, tag: int, nb: int) -> None:
        k = self.wait_count.get((src, j, tag), 0)
        self.wait_count[(src, j, tag)] = k + 1
        key = (src, j, tag, k)
        self.status[j] = "wait"
        if key in self.arrivals:
            arr = self.arrivals[key]
            self.wake[j] = self.downlink(j, self.t, arr + self.wake_s if arr > self.t else arr, nb)
        else:
            self.wake[j] = None
            self.waiting[key] = (j, self.t, nb)

    def step(self, j: int) -> None:
        """Run node j's instantaneous steps until it computes, waits or ends."""
        while True:
            if self.idx[j] >= len(self.progs[j]):
                self.status[j], self.end[j] = "done", self.t
                return
            s = self.progs[j][self.idx[j]]
            self.idx[j] += 1
            if s[0] == "c":
                self.status[j], self.rem[j] = "run", s[1]
                return
            if s[0] == "s":
                self.send(j, s[1], s[2], s[3])
                continue
            if s[0] == "w":
                self.wait(j, s[1], s[2], s[3])
                return
            if s[0] == "f":
                self.status[j], self.wake[j] = "wait", max(self.t, self.last_out[j])
                return
            raise ValueError(f"unknown step {s!r}")

    def advance(self, oversub: float, corun: float) -> None:
        """Move time to the next event (a compute segment's end or a wake-up) and step the nodes it frees."""
        running = [j for j in range(self.n) if self.status[j] == "run"]
        rate = (min(1.0, self.cores / len(running)) * (oversub if len(running) > self.cores else 1.0)
                * (corun if len(running) > 1 else 1.0)) if running else 1.0
        cands = [self.t + self.rem[j] / rate for j in running]
        cands += [w for j, w in enumerate(self.wake) if self.status[j] == "wait" and w is not None]
        if not cands:
            raise RuntimeError("latency model deadlock: a node waits for a message nobody sends")
        t_next = max(self.t, min(cands))
        for j in running:
            self.rem[j] -= (t_next - self.t) * rate
        self.t = t_next
        for j in range(self.n):
            if (self.status[j] == "run" and self.rem[j] <= 1e-12) or \
                    (self.status[j] == "wait" and self.wake[j] is not None and self.wake[j] <= self.t):
                self.wake[j] = None
                self.step(j)


def replay(progs: list[list[Step]], link: LinkModel, cores: int, delay: Delay, wake_s: float = 0.0,
           oversub: float = 1.0, corun: float = 1.0, burst_bytes: float = 0.0, busy_s: float = 0.0) -> float:
    """Seconds from the leader's start to its end of one inference (overlap as the executor does it).

    ``wake_s``: a node that blocks on a message that has not arrived yet resumes ``wake_s`` after
    its arrival (the wake-up of a sleeping process and its transport thread); a message already
    there when the node asks for it costs no wake-up. ``oversub``: the share of the cores that does
    useful work while more nodes compute than there are cores (context switches, caches). ``corun``: the
    speed of each node while more than one computes at once on the same host, on top of ``oversub``
    (fitted; two plain forward passes at once do not slow each other on the benchmark host, the
    retired corun_probe in bench/ARCHIVE.md, so it stands for what the node runtime's threads add while both
    compute).
    ``burst_bytes``: the link is a kernel shaper's token bucket on each node's egress (Linux tbf, as
    bench.netns sets it up) instead of a paced interface both ways: a message leaves at once for as many
    bytes as the bucket holds, the rest at ``link.bandwidth_bps``; the bucket refills at that rate up to
    ``burst_bytes``; nothing limits the receiving side (0: every byte paced at both ends, as the runtime's
    pacing and a switch port do). ``busy_s``: a message sent while the other nodes' computing fills every core
    but the sender's arrives ``busy_s`` later (the receiver's gloo I/O thread waits for a core;
    the retired inrun_probe in bench/ARCHIVE.md measured it inside real runs)."""
    r = _Replay(progs, link, cores, delay, wake_s, burst_bytes, busy_s)
    for j in range(r.n):
        r.step(j)
    for _ in range(10_000_000):
        if all(s == "done" for s in r.status):
            break
        r.advance(oversub, corun)
    return r.end[0]


def no_overlap(progs: list[list[Step]], link: LinkModel, cores: int, delay: Delay) -> float:
    """Compute (N nodes on ``cores`` cores) plus every exchange in turn, nothing overlapped."""
    comp = [compute_s(p) for p in progs]
    t = max(max(comp), sum(comp) / max(1, min(cores, len(progs))))
    by_tag: dict[int, list[tuple[int, int, int]]] = {}
    for j, p in enumerate(progs):
        for s in p:
            if s[0] == "s":
                by_tag.setdefault(s[2], []).append((j, s[1], s[3]))
    for msgs in by_tag.values():
        up: dict[int, int] = {}
        down: dict[int, int] = {}
        for src, dst, nb in msgs:
            up[src] = up.get(src, 0) + nb
            down[dst] = down.get(dst, 0) + nb
        busiest = max(max(up.values()), max(down.values()))
        t += link.wire_time(busiest) + link.latency_s + delay(max(nb for *_, nb in msgs))
    return t


def predict(progs: list[list[Step]], link: LinkModel, cores: int, delay: Delay, recv_overhead_s: float = 0.0
            ) -> dict[str, float]:
    """Both predictions (ms) and the terms behind them (``recv_overhead_s``: see :func:`with_overhead`)."""
    comp = [compute_s(p) for p in progs]
    progs = with_overhead(progs, recv_overhead_s)
    nbytes = sum(s[3] for p in progs for s in p if s[0] == "s")
    return {"predicted_ms": replay(progs, link, cores, delay) * 1e3,
            "predicted_ms_no_overlap": no_overlap(progs, link, cores, delay) * 1e3,
            "compute_ms_per_node": [c * 1e3 for c in comp], "messages": messages(progs),
            "wire_bytes_total": int(nbytes)}


# ---- calibration of the per-message delay: gloo ping-pong through DistTransport ------------------

def _work(n: int) -> None:
    a = torch.ones(64, 64)
    for _ in range(n):
        a @ a


def pingpong(rank: int, port: int, sizes: Sequence[int], reps: int = 30, addr: str = "127.0.0.1",
             paced: bool = False, load_s: float = 0.0) -> list[float]:
    """Run as ranks 0 and 1 of a 2-process gloo group; rank 0 returns the one-way delay per size (s).

    ``paced``: through the pacing thread at a bandwidth so high that only its hand-off costs.
    ``load_s`` > 0: both ranks compute (a fixed amount of work, ``load_s`` seconds when alone)
    between posting a receive and sending, as the executor does, so the delay includes what
    busy cores cost the message (each round's time minus the work's time alone)."""
    from datetime import timedelta

    import torch.distributed as dist

    from .transport import DistTransport

    torch.set_num_threads(1)
    store = dist.TCPStore(addr, port, 2, is_master=rank == 0, timeout=timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=30))
    tr = DistTransport(rank, 2, codec="fp32", link=LinkModel(1e15) if paced else None)
    peer = 1 - rank
    n_work, work_s = 0, 0.0
    if load_s > 0:
        t0 = time.perf_counter()
        _work(200)
        n_work = max(1, int(200 * load_s / (time.perf_counter() - t0)))
        ts = []
        for _ in range(20):
            t0 = time.perf_counter()
            _work(n_work)
            ts.append(time.perf_counter() - t0)
        work_s = float(np.median(ts))
    out = []
    for k, nb in enumerate(sizes):
        x = torch.zeros(max(1, nb // 4))
        ts = []
        for r in range(reps + 3):
            tag = 100 + k
            dist.barrier()
            t0 = time.perf_counter()
            if load_s > 0:
                h = tr.recv(tag, peer, tuple(x.shape))
                _work(n_work)
                tr.send(tag, peer, x)
                h.wait()
            elif rank == 0:
                tr.send(tag, peer, x)
                tr.recv(tag, peer, tuple(x.shape)).wait()
            else:
                tr.recv(tag, peer, tuple(x.shape)).wait()
                tr.send(tag, peer, x)
            tr.flush()
            if r >= 3:
                ts.append(time.perf_counter() - t0)
        out.append(float(np.median(ts)) - work_s if load_s > 0 else float(np.median(ts)) / 2)
    dist.barrier()
    tr.close()
    dist.destroy_process_group()
    return out


def fit_delay(sizes: Sequence[int], one_way: Sequence[float]) -> Delay:
    """Least-squares a + b*S on relative error (small messages count as much as big ones), both >= 0."""
    s = np.asarray(sizes, dtype=np.float64)
    y = np.asarray(one_way, dtype=np.float64)
    w = 1.0 / np.maximum(y, 1e-9)
    A = np.stack([np.ones_like(s), s], 1) * w[:, None]
    (a, b), *_ = np.linalg.lstsq(A, y * w, rcond=None)
    return Delay(max(0.0, float(a)), max(0.0, float(b)))


def calibrate_delay(sizes: Sequence[int] = (64, 4096, 65536, 524288, 2097152, 4194304), reps: int = 30,
                    paced: bool = False, load_s: float = 0.0) -> tuple[Delay, dict[str, Any]]:
    """Start two processes, ping-pong through DistTransport, fit the delay model."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from .launch import free_port

    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "pp.json"
        cmd = [sys.executable, "-m", "disco.runtime.latency", "pingpong", str(port), json.dumps(list(sizes)),
               str(reps), "1" if paced else "0", str(load_s)]
        procs = [subprocess.Popen(cmd + [str(r), str(out)]) for r in (0, 1)]
        for p in procs:
            p.wait(timeout=300)
        if any(p.returncode for p in procs):
            raise RuntimeError(f"ping-pong failed: exit codes {[p.returncode for p in procs]}")
        one_way = json.loads(out.read_text())
    delay = fit_delay(sizes, one_way)
    return delay, {"sizes": list(sizes), "one_way_s": one_way, "a_s": delay.a, "b_s_per_byte": delay.b,
                   "paced": paced, "load_s": load_s}


if __name__ == "__main__":
    import sys

    if len(sys.argv) >= 2 and sys.argv[1] == "pingpong":
        port, sizes, reps, paced, load, rank, out = int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4]), \
            sys.argv[5] == "1", float(sys.argv[6]), int(sys.argv[7]), sys.argv[8]
        res = pingpong(rank, port, sizes, reps, paced=paced, load_s=load)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(res, f)
        import os

        os._exit(0)
