"""The split as a service under load (issue 41 item 8): a served ONNX export of MODEL (N=2, r=RATIO) at each
emulated link (codec@bandwidth, pacing as ``disco run``), closed-loop clients K = 1, 4, 16 for a fixed number of
requests each; the same load against one process serving the whole model through the same front; ``disco run``'s
latency for the same export and link; and a fault run (SIGKILL of rank 1 mid-load, the same command again after
2 s). Every answer is checked against the one-process model (the whole model in ONNX Runtime) on its own input.
Writes results/serve.json, an entry per run as it ends; a rerun skips the entries that are there (resumable).

    python -m bench.serve                                   # resnet50 224 px, 10,000 requests per run
    python -m bench.serve --requests 300 --work /tmp/sw     # what fits a shared 2-core machine
    python -m bench.serve --model cifar_resnet20 --shape 1,3,32,32 --requests 100 --out /tmp/s.json  # quick look
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench.serve")
POOL = 8  # different inputs, cycled with an offset per client: answers of interleaved requests are told apart
STATS_EVERY_S = 1.0
BACKOFF_S = 0.1


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def export(model: str, shape: list[int], nodes: int, ratio: float, work: Path) -> Path:
    """The split's ONNX export (``disco export``), once."""
    out = work / f"{model}_n{nodes}_r{ratio:g}"
    if not (out / "manifest.json").is_file():
        subprocess.run([sys.executable, "-m", "disco.cli", "export", model, "--nodes", str(nodes), "--ratio",
                        str(ratio), "--input-shape", ",".join(map(str, shape)), "--format", "onnx", "--out", str(out)],
                       check=True, cwd=ROOT)
    return out


def whole(model: str, shape: list[int], work: Path) -> Path:
    """The whole model as a one-rank "export" (one ``run`` step), served by ``disco-node --nodes 1 --serve``:
    the same front, the same engine, no split (the architecture at random init, seed 0)."""
    import torch

    from disco.models import build_model

    out = work / f"{model}_whole"
    if (out / "rank0" / "schedule.json").is_file():
        return out
    (out / "rank0").mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    m = build_model(model).eval()
    x = torch.randn(shape)
    torch.onnx.export(m, (x,), str(out / "rank0" / "whole.onnx"), dynamo=False, input_names=["x"],
                      output_names=["y"])
    with torch.no_grad():
        y = m(x).numpy()
    np.savez(out / "rank0" / "reference.npz", x=x.numpy(), y=y)
    sch = {"format": "disco-onnx-schedule/1", "rank": 0, "nodes": 1,
           "inputs": [{"name": "x", "shape": shape, "dtype": "float32"}],
           "outputs": [{"name": "y", "shape": list(y.shape), "dtype": "float32"}],
           "steps": [{"op": "run", "graph": "whole.onnx", "inputs": ["x"], "outputs": ["y"]}]}
    (out / "rank0" / "schedule.json").write_text(json.dumps(sch))
    return out


def one_process_outputs(folder: Path, pool: list[np.ndarray]) -> list[np.ndarray]:
    """The split export's function on each input, computed by the whole model in one process: the export's
    in-process proof path (every rank's graphs, in-process queues, lossless) is the one-process reference."""
    from disco.edge.simulate import simulate

    man = json.loads((folder / "manifest.json").read_text())
    return [next(iter(simulate(folder, {man["input"]: x})[0].values())) for x in pool]


class Served:
    """A served group on 127.0.0.1 (the ranks started as ``disco serve`` starts them), rank 1 killable."""

    def __init__(self, folder: Path, nodes: int, node_args: list[str], no_verify: bool = False) -> None:
        from disco.edge.supervise import Supervisor

        self.port = _free_port()
        self.sup = Supervisor(folder, nodes, self.port, node_args=node_args + (["--no-verify"] if no_verify else []),
                              serve_args=["--max-queue", "64", "--request-timeout", "60"])
        self.procs: dict[int, subprocess.Popen] = {}
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = folder.resolve().name
        self.logs = folder.parent / "logs"
        self.logs.mkdir(exist_ok=True)

    def start(self, rank: int) -> None:
        err = open(self.logs / f"rank{rank}.err", "a")  # noqa: SIM115 - the process writes it
        self.procs[rank] = subprocess.Popen(self.sup.command(rank), env=self.sup.env, stdout=subprocess.DEVNULL,
                                            stderr=err)
        err.close()

    def __enter__(self) -> Served:
        for r in range(self.sup.nodes):
            self.start(r)
        self.wait_ready(True, 600)
        return self

    def stats(self) -> dict[str, Any]:
        from disco.edge.client import Client

        try:
            c = Client(self.url, self.model, timeout=10)
            return json.loads(c._call(f"/v2/models/{self.model}/stats")[1])
        except Exception:  # not up yet, or answering 503 while down
            return {}

    def wait_ready(self, ready: bool, limit_s: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < limit_s:
            if bool(self.stats().get("ready")) == ready:
                return time.monotonic() - t0
            if self.procs[0].poll() is not None:
                raise RuntimeError(f"rank 0 ended: {(self.logs / 'rank0.err').read_text()[-1000:]}")
            time.sleep(0.05)
        raise RuntimeError(f"not {'ready' if ready else 'unready'} within {limit_s} s")

    def __exit__(self, *exc: Any) -> None:
        if self.procs[0].poll() is None:
            self.procs[0].send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def load(s: Served, pool: list[np.ndarray], want: list[np.ndarray], clients: int, requests: int, tol: float,
         during: Any = None) -> dict[str, Any]:
    """``clients`` closed-loop clients send ``requests`` in all (input i % POOL, each client its own offset);
    every answer is checked. ``during(s)``: run in a thread beside the load (the fault); the clients then go on
    past ``requests`` until it has ended (the service is back), so that the load spans the whole fault."""
    from disco.edge.client import Client
    from disco_edge.engine import rel_err

    nxt, lock = [0], threading.Lock()
    lat: list[float] = []
    failed: list[str] = []
    wrong: list[float] = []
    hung, worst = [0], [0.0]
    rss: dict[int, list[float]] = {}
    done, side_done = threading.Event(), threading.Event()
    if during is None:
        side_done.set()

    def client(k: int) -> None:
        c = Client(s.url, s.model, timeout=120)  # the server's own deadline is 60 s: past 120 s a request hung
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= requests and side_done.is_set():
                return
            j = (i + 3 * k) % len(pool)
            t0 = time.perf_counter()
            try:
                (y,) = c.infer({name: pool[j]}, rid=f"{k}-{i}").values()
            except Exception as e:  # an HTTP error with its body, or a timeout (a hung request)
                msg = str(e)
                with lock:
                    (hung.__setitem__(0, hung[0] + 1) if "timed out" in msg else failed.append(msg[:200]))
                time.sleep(BACKOFF_S)  # a client waits a little before its next request after a failure
                continue
            dt = time.perf_counter() - t0
            err = rel_err([y], [want[j]])
            with lock:
                lat.append(dt)
                worst[0] = max(worst[0], err)
                if not err <= tol or int(np.argmax(y)) != int(np.argmax(want[j])):
                    wrong.append(err)

    def sampler() -> None:
        while not done.is_set():
            for n in s.stats().get("nodes", []):
                if n.get("rss_mb"):
                    rss.setdefault(n["rank"], []).append(n["rss_mb"])
            done.wait(STATS_EVERY_S)

    name = _input_name(s)
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    cpu0, comp0 = _host_cpu(), _compute_s(s.stats())
    def beside() -> None:
        try:
            during(s)
        finally:
            side_done.set()

    side = [threading.Thread(target=sampler)] + ([threading.Thread(target=beside)] if during else [])
    t0 = time.perf_counter()
    for t in side + threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cpu1 = _host_cpu()
    done.set()
    for t in side:
        t.join()
    st = s.stats()
    comp = _compute_s(st) - comp0
    lat_ms = np.asarray(lat) * 1e3
    out = {"clients": clients, "requests": nxt[0] - clients, "answered": len(lat), "failed": len(failed),
           "wrong": len(wrong), "hung": hung[0], "failed_with_error_body": sum(1 for f in failed if "HTTP" in f),
           "failure_examples": sorted(set(failed))[:3], "max_rel_err": worst[0], "wall_s": round(wall, 3),
           "throughput_per_s": len(lat) / wall if wall else None,
           "latency_ms_p50": float(np.percentile(lat_ms, 50)) if len(lat) else None,
           "latency_ms_p99": float(np.percentile(lat_ms, 99)) if len(lat) else None,
           "rss_mb_per_node": {str(r): {"first": v[0], "after_warmup": v[len(v) // 10], "last": v[-1], "max": max(v),
                                        "samples": len(v), "series": v[:: max(1, len(v) // 50)]}
                               for r, v in rss.items()},
           "peak_rss_mb_per_node": [n.get("peak_rss_mb") for n in st.get("nodes", [])],
           # what the host had left: the share of all its cores' time that was busy (every process: nodes, front,
           # clients), and the nodes' own compute (ONNX Runtime runs) as a share of it
           "host_cpu_busy": round(1 - (cpu1[1] - cpu0[1]) / max(cpu1[0] - cpu0[0], 1), 3),
           "nodes_compute_share": round(comp / (wall * (os.cpu_count() or 1)), 3) if wall else None}
    return out


def _host_cpu() -> tuple[int, int]:
    """(all, idle) jiffies of every core since boot (Linux ``/proc/stat``; idle includes iowait)."""
    f = Path("/proc/stat").read_text().split("\n")[0].split()[1:]
    v = [int(x) for x in f]
    return sum(v[:8]), v[3] + v[4]


def _compute_s(stats: dict[str, Any]) -> float:
    """Seconds every node spent in its ONNX Runtime runs so far (each node's last report)."""
    return sum(float((n.get("totals") or {}).get("compute_s", 0.0)) for n in stats.get("nodes", []))


def _input_name(s: Served) -> str:
    from disco.edge.client import Client

    return Client(s.url, s.model).metadata()["inputs"][0]["name"]


def disco_run(folder: Path, codec: str, bandwidth: str, iters: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "disco.cli", "run", str(folder), "--nodes", "2", "--codec", codec, "--iters",
           str(iters), "--warmup", "3", "--json", "--max-rel-err", "0.05"]
    if bandwidth != "none":
        cmd += ["--bandwidth", bandwidth]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=3600)
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or [""])[-1][:300]}
    rep = json.loads(p.stdout.strip().splitlines()[-1])
    return {k: rep[k] for k in ("latency_ms_median", "peak_rss_mb_per_node", "max_rel_err_vs_single_process",
                                "bytes_sent_total")}


def load_time(folder: Path) -> float:
    """Seconds a rank 1 process takes from its start to its engine loaded (python start, verify, sessions)."""
    code = ("import sys, time; t0 = time.monotonic(); from disco_edge import bundle; from disco_edge.engine import "
            "Engine; from disco_edge.codecs import get_codec; from disco_edge.transport import NoLink; "
            f"Engine(bundle.load({str(folder)!r}, 1, 2), NoLink(), get_codec('fp32')); "
            "print(time.monotonic() - t0)")
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    return time.monotonic() - t0


def fault(restart_after: float = 2.0) -> Any:
    """SIGKILL rank 1 once a few requests are done, the same command again after ``restart_after`` s; the
    seconds from that start to ready go to ``fault.result``."""
    result: dict[str, Any] = {}

    def run(s: Served) -> None:
        time.sleep(3.0)
        s.procs[1].send_signal(signal.SIGKILL)
        s.procs[1].wait()
        t_kill = time.monotonic()
        try:
            result["unready_after_s"] = round(s.wait_ready(False, 30), 3)
        except RuntimeError as e:
            result["error"] = str(e)
        time.sleep(max(0.0, restart_after - (time.monotonic() - t_kill)))
        s.start(1)
        result["ready_again_s"] = round(s.wait_ready(True, 300), 3)  # from the restarted process's start
        result["down_s"] = round(time.monotonic() - t_kill, 3)

    run.result = result  # type: ignore[attr-defined]
    return run


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.serve", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--shape", default="1,3,224,224")
    p.add_argument("--ratio", type=float, default=0.2)
    p.add_argument("--links", default="fp16@1gbit,fp32@100mbit", help="codec@bandwidth, comma-separated")
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--requests", type=int, default=10000, help="requests per run")
    p.add_argument("--fault-clients", type=int, default=4)
    p.add_argument("--run-iters", type=int, default=30, help="disco run's timed inferences")
    p.add_argument("--work", type=Path, default=Path("/tmp/disco-bench-serve"))
    p.add_argument("--out", type=Path, default=ROOT / "results" / "serve.json")
    p.add_argument("--skip", default="", help="kinds of run to leave out: fault, whole (comma-separated)")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    a.work.mkdir(parents=True, exist_ok=True)
    shape = [int(v) for v in a.shape.split(",")]
    data = json.loads(a.out.read_text()) if a.out.is_file() else {"runs": []}
    old = data.get("setup", {})
    runs = old.get("commands") or ([{k: old[k] for k in ("command", "load_average_at_start")}] if "command" in old
                                   else [])
    runs.append({"command": "python -m bench.serve " + " ".join(sys.argv[1:]),
                 "load_average_at_start": [round(v, 2) for v in os.getloadavg()]})
    data["setup"] = {"model": a.model, "input_shape": shape, "nodes": 2, "ratio": a.ratio, "pool_inputs": POOL,
                     "host_cpus": os.cpu_count(), "commands": runs}
    have = {json.dumps(e["key"], sort_keys=True) for e in data["runs"]}

    def save(key: dict[str, Any], entry: dict[str, Any]) -> None:
        data["runs"].append({"key": key, **key, **entry, "when": time.strftime("%Y-%m-%d %H:%M:%S")})
        a.out.write_text(json.dumps(data, indent=1))
        have.add(json.dumps(key, sort_keys=True))
        log.info("%s -> %s", key, {k: entry.get(k) for k in ("throughput_per_s", "latency_ms_p50", "failed",
                                                              "wrong", "hung", "latency_ms_median", "ready_again_s")})

    def todo(key: dict[str, Any]) -> bool:
        return json.dumps(key, sort_keys=True) not in have

    folder = export(a.model, shape, 2, a.ratio, a.work)
    rng = np.random.default_rng(1)
    pool = [rng.standard_normal(shape).astype(np.float32) for _ in range(POOL)]
    want = one_process_outputs(folder, pool)
    if todo({"kind": "load_time"}):
        save({"kind": "load_time"}, {"rank1_load_s": round(load_time(folder), 3)})
    for link in a.links.split(","):
        codec, bw = link.split("@")
        tol = 1e-4 if codec == "fp32" else 2e-2
        base = {"codec": codec, "bandwidth": bw}
        if todo({"kind": "disco_run", **base}):
            save({"kind": "disco_run", **base}, disco_run(folder, codec, bw, a.run_iters))
        args = ["--codec", codec, "--timeout", "20"] + ([] if bw == "none" else ["--bandwidth", bw])
        keys = [{"kind": "load", "server": "split", **base, "clients": int(k), "requests": a.requests}
                for k in a.clients.split(",")]
        if any(todo(k) for k in keys):
            with Served(folder, 2, args) as s:
                for key in keys:
                    if todo(key):
                        save(key, load(s, pool, want, key["clients"], a.requests, tol))
        key = {"kind": "fault", "server": "split", **base, "clients": a.fault_clients, "requests": a.requests}
        if todo(key) and "fault" not in a.skip:
            with Served(folder, 2, args) as s:
                f = fault()
                entry = load(s, pool, want, a.fault_clients, a.requests, tol, during=f)
                save(key, {**entry, "fault": f.result})
    if "whole" in a.skip:
        return
    single = whole(a.model, shape, a.work)
    keys = [{"kind": "load", "server": "whole", "clients": int(k), "requests": a.requests}
            for k in a.clients.split(",")]
    if any(todo(k) for k in keys):
        with Served(single, 1, [], no_verify=True) as s:
            want1 = [_whole_outputs(single, x) for x in pool]
            for key in keys:
                if todo(key):
                    save(key, load(s, pool, want1, key["clients"], a.requests, 1e-4))


def _whole_outputs(folder: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(folder / "rank0" / "whole.onnx"), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


if __name__ == "__main__":
    main()
