"""The latency model's remaining misses: how much one run varies, and whether two nodes slow each other.

    OMP_NUM_THREADS=1 .venv/bin/python bench/noise.py      # results/noise.json, about 3 minutes

1. **Repeated runs**: the same export (CIFAR ResNet-20, N=2, r=0, as ``bench/latency.py`` makes it) run
   4 times on loopback with ``disco run``'s launcher, 300 timed inferences each: every run's median and
   the medians of its first and last 100 (a run can switch between a fast and a slow phase).
2. **Co-running**: each node's r=0 program (no link: only the input and output would cross) timed over a
   transport that delivers at once, once alone and once with the other node's program running at the
   same time in another process (1 torch thread each); for resnet50 at 1x3x224x224 and CIFAR ResNet-20.
   The latency traces time each node alone, so a slowdown here is one the model does not see.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))
OUT = ROOT / "results" / "noise.json"
CORUN = [("resnet50", (1, 3, 224, 224), 20), ("cifar_resnet20", (1, 3, 32, 32), 200)]


def repeated_runs(runs: int = 4, iters: int = 300) -> list[dict]:
    from latency import Prepared

    from disco.runtime.launch import launch
    from disco.runtime.options import RunOptions

    d = Prepared("cifar_resnet20", 2).export_dir(0.0)
    out = []
    for _ in range(runs):
        ms = np.array(launch(d, 2, RunOptions(iters=iters, warmup=10))["latency_ms_all"])
        out.append({"median": float(np.median(ms)), "first_100": float(np.median(ms[:100])),
                    "last_100": float(np.median(ms[-100:]))})
        print("cifar_resnet20 N=2 r=0 loopback: " + ", ".join(f"{k} {v:.2f} ms" for k, v in out[-1].items()),
              flush=True)
    return out


def _node(name: str, shape: tuple, rank: int, iters: int, q: object, barrier: object) -> None:
    from disco.graph import partition
    from disco.models import build_model
    from disco.runtime.executor import Executor
    from disco.runtime.latency import TraceTransport
    from disco.runtime.plan import RankPlan

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(name).eval()
    x = torch.randn(shape)
    part = partition(model, x, 2)
    plan = RankPlan(part, np.zeros(part.n_links, dtype=bool), rank)
    weights, _ = plan.shard_from(part.gm)
    cdims = {e.tag: e.cdim for e in plan.exchanges.values()}
    ex = Executor(plan, part.gm, weights, TraceTransport(rank, "fp32", cdims))
    inputs = [x] if rank == 0 else None
    for _ in range(3):
        ex.run(inputs)
    barrier.wait()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        ex.run(inputs)
        ts.append(time.perf_counter() - t0)
    q.put((rank, float(np.median(ts) * 1e3)))


def co_running() -> list[dict]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    rows = []
    for name, shape, iters in CORUN:
        row: dict = {"model": name, "alone_ms": [], "together_ms": []}
        for together in (False, True):
            q = ctx.Queue()
            if together:
                barrier = ctx.Barrier(2)
                procs = [ctx.Process(target=_node, args=(name, shape, r, iters, q, barrier)) for r in (0, 1)]
                for p in procs:
                    p.start()
                res = sorted(q.get(timeout=600) for _ in procs)
                for p in procs:
                    p.join()
            else:
                res = []
                for r in (0, 1):
                    barrier = ctx.Barrier(1)  # kept referenced until the child has it
                    p = ctx.Process(target=_node, args=(name, shape, r, iters, q, barrier))
                    p.start()
                    res.append(q.get(timeout=600))
                    p.join()
            row["together_ms" if together else "alone_ms"] = [ms for _, ms in res]
        rows.append(row)
        print(f"{name} r=0 N=2 per node: alone {row['alone_ms']}, together {row['together_ms']} (ms)", flush=True)
    return rows


def main() -> int:
    out = {"method": __doc__.strip(), "command": "OMP_NUM_THREADS=1 .venv/bin/python bench/noise.py",
           "repeated_runs": repeated_runs(), "co_running": co_running()}
    OUT.write_text(json.dumps(out, indent=1))
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
