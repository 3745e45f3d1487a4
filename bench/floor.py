"""What a split can reach on this host, whatever the engine's overheads (issue 30's targets): each rank of an
ONNX export run alone in a process without torch (sends dropped, receives zeros of the right size), every step
timed; then the ranks' timed programs replayed against each other by the latency model's replay (each rank its
own device, each node's link paced both ways as the engines pace it) with no cost per message and every overlap
the schedule allows. The replay's latency is the schedule's floor: the engine on this host cannot beat it. The
replay again with each rank computing at the dense model's rate (one ONNX Runtime process of the whole model,
its defaults, over N) says what a split that computes as well as the whole graph would reach, and without the
input message (every node reading the input, ``disco run --input-at every-node``) what the split reaches where
the input is not on the link. Each rank's memory once its graphs are loaded, before any inference, is the
node's memory floor (and after the node's imports alone, its part that no engine change moves). Writes
results/edge_floor.json (each rank's timed program kept, for other replays).

    OMP_NUM_THREADS=1 python -m bench.floor                    # resnet50 224 px: the settings of the targets
    OMP_NUM_THREADS=1 python -m bench.floor --models cifar_resnet20 --reps 20
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = [(2, 0.2, "global", "fp32"), (2, 0.2, "global", "fp16"), (2, 0.2, "joint", "fp32"),
            (2, 1.0, "global", "fp32")]  # the splits issue 30's targets name
BANDWIDTHS = {"none": None, "1gbit": 1e9, "100mbit": 1e8, "10mbit": 1e7}
log = logging.getLogger("bench.floor")


def time_rank(folder: str, rank: int, nodes: int, codec: str, reps: int) -> dict[str, Any]:
    """In this process (torch blocked): load one rank, note its RSS, time each step over ``reps`` inferences
    (median). Returns the rank's program: ``[op, peer, tag, bytes, seconds, kind]`` per step."""
    sys.modules["torch"] = None  # a node never imports torch
    import numpy as np
    import onnxruntime  # noqa: F401  # (the engine imports it on its first session)

    from disco_edge import bundle
    from disco_edge.codecs import get_codec
    from disco_edge.engine import Engine
    from disco_edge.node import Node  # noqa: F401  # the node's own imports, as a node holds them
    from disco_edge.procstat import peak_rss_mb, rss_mb
    from disco_edge.transport import NoLink

    imports = rss_mb()
    b = bundle.load(folder, rank, nodes, verify=False)
    eng = Engine(b, NoLink(), get_codec(codec))  # type: ignore[arg-type]
    loaded = rss_mb()
    x = b.reference()[0] if rank == 0 else None
    times: list[list[float]] = []
    for _ in range(reps + 2):
        times.append([])
        eng.infer(x, step_s=times[-1])
    med = np.median(times[2:], axis=0)
    prog = []
    for st, sec in zip(b.schedule["steps"], med, strict=True):
        if st["op"] in ("send", "recv"):
            peer = st["to"] if st["op"] == "send" else st["from"]
            prog.append([st["op"], int(peer), int(st["tag"]), eng.nbytes(st), float(sec), st.get("kind", "links")])
        else:
            prog.append(["cpu", -1, -1, 0, float(sec), ""])
    return {"rank": rank, "rss_imports_mb": imports, "rss_loaded_mb": loaded, "peak_rss_mb": peak_rss_mb(),
            "weight_bytes": b.weight_bytes, "compute_ms": float(med.sum() * 1e3), "program": prog}


def replay(progs: list[list[list[Any]]], bandwidth_bps: float | None) -> float:
    """The latency (s) of the ranks' timed programs run against each other by the latency model's replay
    (:func:`disco.runtime.latency.replay`: each rank its own device, each node's link paced both ways as the
    engines pace it) with no cost per message: a step's time is compute (a send's before it leaves, a
    receive's once its message is there)."""
    from disco.runtime.latency import Delay
    from disco.runtime.latency import replay as model_replay
    from disco.runtime.transport import LinkModel

    def steps(prog: list[list[Any]]) -> list[tuple]:
        out: list[tuple] = []
        for op, peer, tag, nbytes, sec, *_ in prog:
            if op == "send":
                out += [("c", sec), ("s", peer, tag, nbytes)]
            elif op == "recv":
                out += [("w", peer, tag, nbytes), ("c", sec)]
            else:
                out.append(("c", sec))
        return [*[s for s in out if s[0] != "c" or s[1] > 0], ("f",)]

    return model_replay([steps(p) for p in progs], LinkModel(bandwidth_bps), len(progs), Delay(0.0, 0.0))


def scaled(prog: list[list[Any]], factor: float) -> list[list[Any]]:
    """``prog`` with every compute step ``factor`` times as long."""
    return [[*st[:4], st[4] * factor if st[0] == "cpu" else st[4], *st[5:]] for st in prog]


def every_node(prog: list[list[Any]]) -> list[list[Any]]:
    """``prog`` with the input read by every node (``--input-at every-node``): no input message."""
    return [st for st in prog if st[5:6] != ["input"]]


def floor(model: str, setting: tuple, work: Path, reps: int, one_ms: float) -> dict[str, Any]:
    from .edge import MODELS, export

    n, r, budget, codec = setting
    folder = export(model, MODELS[model], (n, r, budget), "onnx", work)
    ranks = []
    for k in range(n):  # one process per rank, one after the other: each alone on the host
        p = subprocess.run([sys.executable, "-m", "bench.floor", "--rank-of", str(folder), str(k), str(n), codec,
                            str(reps)], capture_output=True, text=True, check=True, cwd=ROOT)
        ranks.append(json.loads(p.stdout.strip().splitlines()[-1]))
    progs = [x["program"] for x in ranks]
    at_dense_rate = [scaled(p, one_ms / n / x["compute_ms"]) for p, x in zip(progs, ranks, strict=True)]
    return {"model": model, "nodes": n, "target_ratio": r, "budget": budget, "codec": codec, "reps": reps,
            "one_process_ms": one_ms, "ranks": ranks,
            "floor_ms": {bw: replay(progs, bps) * 1e3 for bw, bps in BANDWIDTHS.items()},
            "floor_ms_dense_rate": {bw: replay(at_dense_rate, bps) * 1e3 for bw, bps in BANDWIDTHS.items()},
            "floor_ms_every_node": {bw: replay([every_node(p) for p in progs], bps) * 1e3
                                    for bw, bps in BANDWIDTHS.items()},
            "bytes_per_rank": [sum(s[3] for s in p) for p in progs]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet50", help="comma-separated, of bench.edge's models")
    p.add_argument("--reps", type=int, default=10, help="timed inferences per rank (default: 10)")
    p.add_argument("--work", help="folder for the exports (default: a temporary one)")
    p.add_argument("--out", default=str(ROOT / "results" / "edge_floor.json"))
    p.add_argument("--rank-of", nargs=5, help=argparse.SUPPRESS)  # the child: FOLDER RANK NODES CODEC REPS
    a = p.parse_args()
    if a.rank_of:
        f, rank, nodes, codec, reps = a.rank_of
        print(json.dumps(time_rank(f, int(rank), int(nodes), codec, int(reps))))
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(a.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        for m in a.models.split(","):
            from .edge import MODELS, single_ort

            one = single_ort(m, MODELS[m], a.reps, work, "default")  # the fastest one process of the model
            for s in SETTINGS:
                out.append(res := floor(m, s, work, a.reps, one["latency_ms_median"]))
                log.info("%s %s: floor %s ms (at the dense rate %s), ranks loaded at %s MB", m, s,
                         {k: round(v, 1) for k, v in res["floor_ms"].items()},
                         {k: round(v, 1) for k, v in res["floor_ms_dense_rate"].items()},
                         [round(x["rss_loaded_mb"], 1) for x in res["ranks"]])
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
