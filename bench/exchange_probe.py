"""Where an unshaped exchange round goes: timestamps and per-thread CPU inside two node processes.

    OMP_NUM_THREADS=1 .venv/bin/python bench/exchange_probe.py     # results/exchange_probe.json

Two processes (gloo on 127.0.0.1, 1 torch thread each) run CIFAR ResNet-20's N=2 plan (random init,
dense and the one-shot magnitude selection at r = 0.1) through the runtime's own ``DistTransport`` and
``Executor``, 120 inferences after 20 untimed ones, once with gloo's I/O threads at niceness 0 and once
at 19 (what ``disco run --io-nice`` sets). Recorded per rank: how long each ``isend`` call blocks, the
time spent waiting for messages, the main thread's CPU time per inference against the same plan run
over a transport that delivers at once (zero communication cost), and the CPU time of every thread of
the process over the timed inferences (gloo names its event loop ``gloo_tcp_loop``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
OUT = ROOT / "results" / "exchange_probe.json"
WARMUP, ITERS = 20, 120


def thread_cpu() -> dict[str, float]:
    """CPU seconds per thread name of this process (Linux /proc), summed over threads of one name."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            st = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue
        name = st[st.index("(") + 1:st.rindex(")")]
        f = st[st.rindex(")") + 2:].split()
        out[name] = out.get(name, 0.0) + (int(f[11]) + int(f[12])) / tick
    return out


def node(rank: int, port: int, ratio: float, nice: int, q: object) -> None:
    import torch.distributed as dist

    from disco.graph import partition
    from disco.masks import DiscoModel
    from disco.models import build_model
    from disco.runtime import transport as T
    from disco.runtime.executor import Executor
    from disco.runtime.latency import TraceTransport
    from disco.runtime.plan import RankPlan
    from disco.sparsify import magnitude_scores, select_links

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model("cifar_resnet20").eval()
    x = torch.randn(1, 3, 32, 32)
    part = partition(model, x, 2)
    kept = part.all_links() if ratio >= 1 else select_links(part, magnitude_scores(DiscoModel(model, part)),
                                                             ratio, "global")
    plan = RankPlan(part, kept, rank)
    weights, _ = plan.shard_from(part.gm)
    cdims = {e.tag: e.cdim for e in plan.exchanges.values()}
    inputs = [x] if rank == 0 else None

    alone = Executor(plan, part.gm, weights, TraceTransport(rank, "fp32", cdims))
    cpu_alone = []
    for k in range(WARMUP + ITERS):
        c0 = time.thread_time()
        alone.run(inputs)
        if k >= WARMUP:
            cpu_alone.append(time.thread_time() - c0)

    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    T.lower_io_threads(nice)
    sends: list[float] = []
    waits: list[float] = []

    class Probe(T.DistTransport):
        def _post_send(self, buf: torch.Tensor, dst: int, tag: int) -> None:
            t0 = time.perf_counter()
            super()._post_send(buf, dst, tag)
            sends.append(time.perf_counter() - t0)

        def _post_recv(self, nbytes: int, src: int, tag: int):  # noqa: ANN202 - the base's waiter
            inner = super()._post_recv(nbytes, src, tag)

            def wait() -> torch.Tensor:
                t0 = time.perf_counter()
                buf = inner()
                waits.append(time.perf_counter() - t0)
                return buf

            return wait

    tr = Probe(rank, 2, codec="fp32", n_links=part.n_links, values_per_link=part.links.values, cdims=cdims)
    ex = Executor(plan, part.gm, weights, tr)
    for _ in range(WARMUP):
        ex.run(inputs)
    dist.barrier()
    sends.clear()
    waits.clear()
    lat, cpu = [], []
    c_start, w0 = thread_cpu(), time.perf_counter()
    for _ in range(ITERS):
        t0, c0 = time.perf_counter(), time.thread_time()
        ex.run(inputs)
        lat.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    wall = time.perf_counter() - w0
    c_end = thread_cpu()
    dist.barrier()
    ms = 1e3
    q.put({"rank": rank, "latency_ms_median": float(np.median(lat) * ms), "wall_s": wall,
           "isend_ms": {"median": float(np.median(sends) * ms), "mean": float(np.mean(sends) * ms),
                        "p90": float(np.percentile(sends, 90) * ms)} if sends else None,
           "wait_ms_per_inference": float(np.sum(waits) * ms / ITERS),
           "main_cpu_ms_per_inference": float(np.median(cpu) * ms),
           "main_cpu_ms_per_inference_zero_cost_transport": float(np.median(cpu_alone) * ms),
           "thread_cpu_s": {k: round(c_end[k] - c_start.get(k, 0.0), 3) for k in c_end
                            if c_end[k] - c_start.get(k, 0.0) > 0}})
    dist.destroy_process_group()


def main() -> int:
    import torch.multiprocessing as mp

    from disco.runtime.launch import free_port

    ctx = mp.get_context("spawn")
    rows = []
    for ratio in (1.0, 0.1):
        for nice in (0, 19):
            q = ctx.Queue()
            port = free_port()
            procs = [ctx.Process(target=node, args=(r, port, ratio, nice, q)) for r in (0, 1)]
            for p in procs:
                p.start()
            got = sorted((q.get(timeout=600) for _ in procs), key=lambda d: d["rank"])
            for p in procs:
                p.join(timeout=60)
            rows.append({"ratio_target": ratio, "io_nice": nice, "ranks": got})
            r0 = got[0]
            print(f"r={ratio:g} io_nice={nice:2d}: latency {r0['latency_ms_median']:.2f} ms, isend median "
                  f"{r0['isend_ms']['median']:.3f} p90 {r0['isend_ms']['p90']:.3f} ms, main CPU "
                  f"{r0['main_cpu_ms_per_inference']:.2f} ms/inference (zero-cost transport "
                  f"{r0['main_cpu_ms_per_inference_zero_cost_transport']:.2f}), threads {r0['thread_cpu_s']} "
                  f"over {r0['wall_s']:.2f} s", flush=True)
    OUT.write_text(json.dumps({"method": __doc__.strip(),
                               "command": "OMP_NUM_THREADS=1 .venv/bin/python bench/exchange_probe.py",
                               "entries": rows}, indent=1))
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
