"""Where a real unshaped run's time goes, per message: does a message reach a computing node later?

    OMP_NUM_THREADS=1 .venv/bin/python bench/inrun_probe.py      # ~3 min; results/inrun_probe.json

For each model, the sweep's N=2 r=0.1 fp32 export (bench/latency.py makes it) runs with ``disco run``'s
own node program on loopback (no shaping, 1 torch thread per node), 20 timed inferences after 3 warm-up
(10 for rrdbnet, 100 for CIFAR), right after each node's program is traced again alone (the sweep's trace
cache is neither read nor written). Inside each node, every ``send`` and every first ``wait`` on a
received message is timestamped (``time.perf_counter`` is one clock for every process of a Linux host).
Per inference: each node's compute (the time outside sends and waits) against its trace (the same
program timed alone, what the latency model replays), and the time in sends and waits. Per message
(each wait matched with the peer's send of the same inference, in order), the time from the send's end
to the wait's end when the receiver blocked on it, split by what the receiver did when the message was
sent: waiting (a core was free for its gloo I/O thread) or computing (both cores busy with the two
nodes). The latency model's ``busy_s`` is the extra delay of a message sent while the other nodes'
computing fills the cores; this probe is what it stands for, measured, not fitted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "inrun_probe.json"
MODELS = {"deit_small_patch16_224": 20, "resnet50": 20, "rrdbnet": 10, "cifar_resnet20": 100}  # timed inferences
WARMUP = 3
BLOCKED_S = 30e-6  # a wait longer than this blocked: the message had not arrived when the node asked for it


def child(out: str, argv: list[str]) -> None:
    """One node of ``disco run`` with its sends, waits and inferences timestamped into ``out``.RANK."""
    import disco.runtime.executor as E
    import disco.runtime.node as N
    import disco.runtime.transport as T

    ev: list[tuple] = []
    send, wait, run, timed = T.BaseTransport.send, T._Handle.wait, E.Executor.run, N._timed

    def send_(self, tag, dst, t, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        t0 = time.perf_counter()
        r = send(self, tag, dst, t, *a, **k)
        ev.append(("s", t0, time.perf_counter(), dst))
        return r

    def wait_(self):  # noqa: ANN001, ANN202
        if self._val is not None:
            return self._val
        t0 = time.perf_counter()
        r = wait(self)
        ev.append(("w", t0, time.perf_counter(), self.src))
        return r

    def run_(self, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        t0 = time.perf_counter()
        r = run(self, *a, **k)
        ev.append(("r", t0, time.perf_counter()))
        return r

    def timed_(opts, ex, tr, inputs, rank):  # noqa: ANN001, ANN202
        r = timed(opts, ex, tr, inputs, rank)
        Path(f"{out}.{rank}").write_text(json.dumps(ev))
        return r

    T.BaseTransport.send, T._Handle.wait, E.Executor.run, N._timed = send_, wait_, run_, timed_
    N.main(argv)


def measure(d: Path, iters: int, out: Path) -> list[list[list]]:
    from disco.runtime.launch import free_port, node_command

    port = free_port()
    opts = ["--iters", str(iters), "--warmup", str(WARMUP), "--threads", "1", "--timeout", "120"]
    errs = [open(f"{out}.{r}.stderr", "w+") for r in range(2)]  # noqa: SIM115 (closed below)
    # disco run's node command line, with this file (timestamps, then the node's own main) in place of
    # ``python -m disco.runtime.node``
    procs = [subprocess.Popen([sys.executable, __file__, "--child", str(out),
                               *node_command(d, r, 2, port, opts)[3:]],
                              stdout=subprocess.DEVNULL, stderr=errs[r]) for r in range(2)]
    try:
        for r, p in enumerate(procs):
            if p.wait(timeout=600):
                errs[r].seek(0)
                raise RuntimeError(f"{d.name}: node {r} exited with {p.returncode}: {errs[r].read()[-2000:]}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for f in errs:
            f.close()
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(2)]


def per_inference(ev: list[list]) -> list[tuple[float, list[list]]]:
    """(seconds, [sends and waits]) of each timed inference of one node."""
    runs = [e for e in ev if e[0] == "r"]
    res, prev = [], -1e18
    for _, a, b in runs:
        res.append((b - a, [e for e in ev if e[0] in "sw" and prev < e[1] <= b]))
        prev = b
    return res[WARMUP:]


def ms(x: list[float]) -> dict[str, float | int]:
    if not x:
        return {"n": 0}
    return {"n": len(x), "median_ms": round(float(np.median(x)) * 1e3, 3), "mean_ms": round(float(np.mean(x)) * 1e3, 3),
            "p90_ms": round(float(np.percentile(x, 90)) * 1e3, 3)}


def analyse(evs: list[list[list]], progs: list[list]) -> dict:
    per = [per_inference(ev) for ev in evs]
    nodes = []
    for r, runs in enumerate(per):
        alone = sum(s[1] for s in progs[r] if s[0] == "c")
        comp = [t - sum(e[2] - e[1] for e in es) for t, es in runs]
        nodes.append({"rank": r, "inference_ms": ms([t for t, _ in runs])["median_ms"],
                      "compute_ms": ms(comp)["median_ms"], "compute_alone_ms": round(alone * 1e3, 3),
                      "compute_over_alone": round(float(np.median(comp)) / alone, 3),
                      "in_send_ms": ms([sum(e[2] - e[1] for e in es if e[0] == "s") for _, es in runs])["median_ms"],
                      "in_wait_ms": ms([sum(e[2] - e[1] for e in es if e[0] == "w") for _, es in runs])["median_ms"]})
    to_waiting, to_computing, in_time = [], [], 0
    for r in range(2):
        src = 1 - r
        for (_, mine), (_, theirs) in zip(per[r], per[src], strict=False):
            waits = [e for e in mine if e[0] == "w" and e[3] == src]
            sends = [e for e in theirs if e[0] == "s" and e[3] == r]
            if len(waits) != len(sends):
                raise RuntimeError(f"rank {r}: {len(waits)} waits on rank {src}, which sent {len(sends)}")
            all_waits = [e for e in mine if e[0] == "w"]
            for w, s in zip(waits, sends, strict=True):
                waiting = any(x[1] <= s[2] <= x[2] for x in all_waits)
                if w[1] >= s[2] and w[2] - w[1] <= BLOCKED_S:
                    in_time += not waiting
                    continue
                (to_waiting if waiting else to_computing).append(w[2] - s[2])
    return {"per_node": nodes, "sends_per_inference": sum(1 for e in per[0][0][1] + per[1][0][1] if e[0] == "s"),
            "sent_to_a_waiting_node": ms(to_waiting),
            "sent_to_a_computing_node_that_blocked_on_it": ms(to_computing),
            "sent_to_a_computing_node_there_in_time": in_time}


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    import tempfile

    import torch
    from latency import TRACE_REPS, TRACE_WARMUP, Prepared

    from disco.runtime import latency as lat

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models.split(","):
            p = Prepared(name, 2)
            d = p.export_dir(0.1)  # the sweep's export (a trained checkpoint's kept set where there is one)
            torch.set_num_threads(1)  # traced now, beside the run, not taken from the sweep's cache
            progs = lat.trace_plan(p.part, p.kept_at(0.1), p.x, "fp32", reps=TRACE_REPS.get(name, 15),
                                   warmup=TRACE_WARMUP)
            evs = measure(d, MODELS.get(name, 20), Path(tmp) / name)
            rows.append({"model": name, "nodes": 2, "ratio_target": 0.1, "codec": "fp32", **analyse(evs, progs)})
            print(json.dumps(rows[-1]), flush=True)
    out = {"method": __doc__.strip(), "command": "OMP_NUM_THREADS=1 .venv/bin/python bench/inrun_probe.py",
           "blocked_if_wait_over_s": BLOCKED_S, "entries": rows}
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
