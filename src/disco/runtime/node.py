"""The node program: one process per node, the same under ``disco run`` and under torchrun.

    python -m disco.runtime.node DIR [--codec fp16] [--bandwidth 100mbit --latency 2ms] ...

Rendezvous through the environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), as torchrun
sets it; ``--rank/--world-size/--master-addr/--master-port`` override it. Start-up: every
node joins a TCP store (bounded by ``--startup-timeout``), loads and checks its own shard
(the leader also checks the input), and reports ready or the reason it refuses; only when
all N are ready does torch.distributed (gloo) start and compute begin. During the run a
heartbeat thread watches the peers: a peer that dies or stops answering for ``--timeout``
seconds ends every other node with exit code 3 and an error naming the lost rank.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger("disco.node")

EXIT_REFUSED = 2  # bad shard, input or arguments: nothing was computed
EXIT_PEER = 3  # a peer was lost, or start-up did not complete


class NodeError(RuntimeError):
    pass


def _env_int(name: str, default: int | None) -> int | None:
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else default


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m disco.runtime.node", description="one DISCO node")
    p.add_argument("dir", help="export directory (manifest.json + node shards)")
    p.add_argument("--rank", type=int, default=None)
    p.add_argument("--world-size", type=int, default=None)
    p.add_argument("--master-addr", default=None)
    p.add_argument("--master-port", type=int, default=None)
    add_run_options(p)
    p.add_argument("--result", help="the leader writes its JSON report here")
    p.add_argument("--fail-rank", type=int, default=None, help=argparse.SUPPRESS)  # tests: kill this rank ...
    p.add_argument("--fail-after", type=int, default=1, help=argparse.SUPPRESS)  # ... after this many inferences
    return p


def add_run_options(p: argparse.ArgumentParser) -> None:
    """Options shared by the node program and ``disco run``."""
    p.add_argument("--codec", default=None, help="wire codec: fp32 (default: the manifest's), fp16, bf16, int8")
    p.add_argument("--bandwidth", default=None,
                   help="emulated per-node link bandwidth, e.g. 100mbit (default: unshaped)")
    p.add_argument("--latency", default=None, help="emulated one-way latency per message, e.g. 2ms")
    p.add_argument("--input", default=None, help="input tensor file (.safetensors with 'input', .pt or .npy); "
                   "default: the export's probe input, checked against the single-process output")
    p.add_argument("--data", default=None, help="dataset folder: the leader also runs the task's test split "
                   "through the split model and reports its metric (e.g. top1)")
    p.add_argument("--limit", type=int, default=None, help="with --data: only this many test inputs")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20, help="timed inferences")
    p.add_argument("--stream", type=int, default=0, help="also measure throughput with this many inputs in flight")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds without a peer's heartbeat before giving up")
    p.add_argument("--startup-timeout", type=float, default=20.0, help="seconds for all nodes to join")
    p.add_argument("--threads", type=int, default=1, help="torch threads per node")


# ---- start-up -----------------------------------------------------------------------------

def _store(addr: str, port: int, rank: int, world: int, timeout: float, master: bool) -> Any:
    import torch.distributed as dist

    try:
        return dist.TCPStore(addr, port, world, is_master=master, timeout=timedelta(seconds=timeout),
                             wait_for_workers=False)
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if master and ("in use" in msg.lower() or "bind" in msg.lower() or "EADDRINUSE" in msg):
            raise NodeError(f"cannot listen on {addr}:{port}: port already in use ({msg})") from e
        if master:
            raise NodeError(f"cannot start the rendezvous store on {addr}:{port}: {msg}") from e
        raise NodeError(f"cannot reach the leader's store at {addr}:{port} within {timeout:.0f} s "
                        f"(is rank 0 running?): {msg}") from e


def _wait_keys(store: Any, keys: list[str], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        missing = [k for k in keys if not store.check([k])]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise NodeError(f"{what}: {', '.join(missing)} not there after {timeout:.0f} s "
                            f"(missing peer?)")
        time.sleep(0.05)


def _load_input(path: str | None, man: dict[str, Any], d: Path) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
    """The input tensor and, for the export's probe, the single-process reference outputs (by name)."""
    from safetensors.torch import load_file

    ref = None
    if path is None:
        f = d / "reference.safetensors"
        if not f.is_file():
            raise NodeError(f"{d} has no reference.safetensors; pass --input")
        t = load_file(str(f))
        x = t.pop("input")
        ref = t
    elif path.endswith(".safetensors"):
        t = load_file(path)
        x = t.get("input", next(iter(t.values())))
    elif path.endswith(".npy"):
        x = torch.from_numpy(np.load(path))
    else:
        x = torch.load(path, map_location="cpu", weights_only=True)
    check_input(x, man)
    return x, ref


def check_input(x: Any, man: dict[str, Any]) -> None:
    """Refuse an input that is not a float32 tensor of the exported input shape."""
    if not isinstance(x, torch.Tensor):
        raise NodeError(f"input must be a tensor, got {type(x).__name__}")
    want = tuple(man["input_shape"])
    if tuple(x.shape) != want:
        raise NodeError(f"input has shape {tuple(x.shape)}, the model was exported for {want}")
    if x.dtype != torch.float32:
        raise NodeError(f"input has dtype {x.dtype}, expected torch.float32")


# ---- watchdog -----------------------------------------------------------------------------

class Watchdog:
    """Heartbeats through the store; ends this process when a peer stops or another node failed."""

    def __init__(self, addr: str, port: int, rank: int, world: int, timeout: float) -> None:
        self.rank, self.world, self.timeout = rank, world, timeout
        self.store = _store(addr, port, rank, world, max(2.0, timeout), master=False)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="disco-watchdog", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _loop(self) -> None:
        interval = max(0.05, min(0.5, self.timeout / 10))
        last: dict[int, tuple[int, float]] = {}
        while not self.stop.is_set():
            now = time.monotonic()
            try:
                self.store.add(f"hb/{self.rank}", 1)
                if self.store.check(["failed"]):
                    why = self.store.get("failed").decode()
                    _die(self.rank, f"stopping: {why}", self.store, publish=False)
                for r in range(self.world):
                    if r == self.rank or self.store.check([f"done/{r}"]):
                        continue
                    v = self.store.add(f"hb/{r}", 0)
                    if r not in last or last[r][0] != v:
                        last[r] = (v, now)
                    elif now - last[r][1] > self.timeout:
                        _die(self.rank, f"lost rank {r}: no heartbeat for {now - last[r][1]:.1f} s", self.store)
            except Exception as e:  # the store lives in rank 0: it is gone
                if self.stop.is_set():
                    return
                _die(self.rank, f"lost rank 0: its store stopped answering ({str(e).splitlines()[0][:80]})", None)
            self.stop.wait(interval)


def _die(rank: int, why: str, store: Any, publish: bool = True) -> None:
    """Report and exit at once (gloo may be blocked in another thread)."""
    if publish and store is not None:
        try:
            store.set("failed", f"rank {rank} reported: {why}")
        except Exception:  # best effort
            pass
    print(f"disco node {rank}: error: {why}", file=sys.stderr, flush=True)
    os._exit(EXIT_PEER)


# ---- main ---------------------------------------------------------------------------------

def _run_data(args: argparse.Namespace, man: dict[str, Any], ex: Any, store: Any, rank: int,
              probe: torch.Tensor | None) -> dict[str, Any] | None:
    """Run the task's test split through the split model (the leader feeds it; the others follow)."""
    if rank != 0:
        _wait_keys(store, ["data/n"], args.timeout, f"rank {rank}: waiting for the data count")
        for _ in range(int(store.get("data/n"))):
            ex.run(None)
        return None
    from ..tasks import get_task

    task = get_task(man.get("task") or "cifar10")
    _, test = task.loaders(args.data, int(man["input_shape"][0]), limit=args.limit)
    b = int(man["input_shape"][0])  # the split model runs at its exported batch size
    batches = [(xb[i:i + b], yb[i:i + b]) for xb, yb in test for i in range(0, len(yb) - b + 1, b)]
    store.set("data/n", str(len(batches)))
    outs, targets = [], []
    for xb, yb in batches:
        outs.append(ex.run([xb.contiguous()]))
        targets.append(yb)

    class _Replay(torch.nn.Module):  # feeds the recorded distributed outputs to the task's metric
        def __init__(self) -> None:
            super().__init__()
            self.k = 0

        def forward(self, _x: torch.Tensor) -> torch.Tensor:
            self.k += 1
            return outs[self.k - 1]

    metrics = task.evaluate(_Replay(), list(zip([b[0] for b in batches], targets, strict=True)))
    return {"task": task.name, **metrics, "n": len(batches) * b}


def run_node(args: argparse.Namespace) -> dict[str, Any] | None:
    """Start-up, run, report. Returns the leader's report (None on other ranks)."""
    import torch.distributed as dist

    from .executor import Executor
    from .export import compare_reference, load_node, read_manifest
    from .transport import DistTransport, LinkModel, PeerError, get_codec, parse_bandwidth, parse_latency

    rank = args.rank if args.rank is not None else _env_int("RANK", None)
    world = args.world_size if args.world_size is not None else _env_int("WORLD_SIZE", None)
    addr = args.master_addr or os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = args.master_port if args.master_port is not None else _env_int("MASTER_PORT", None)
    if rank is None or world is None or port is None:
        raise NodeError("rank, world size and master port are needed (RANK, WORLD_SIZE, MASTER_PORT or options)")
    torch.set_num_threads(args.threads)
    d = Path(args.dir)
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = _store(addr, port, rank, world, args.startup_timeout, master=(rank == 0 and not agent_store))
    prefix = os.environ.get("DISCO_RUN_ID", "") + "/" if agent_store else ""
    store = dist.PrefixStore("disco/" + prefix, store)
    store.set(f"joined/{rank}", "1")
    _wait_keys(store, [f"joined/{r}" for r in range(world)], args.startup_timeout, f"rank {rank}: start-up")

    # load and check before any compute; tell the others why we refuse
    status: dict[str, Any] = {"ok": True}
    try:
        man = read_manifest(d)
        state = load_node(d, rank, world)
        codec = get_codec(args.codec or man.get("codec", "fp32"))
        x = ref = None
        if rank == 0:
            x, ref = _load_input(args.input, man, d)
        status.update(model_hash=man["model_hash"], fingerprint=man["fingerprint"])
    except Exception as e:
        status = {"ok": False, "why": f"rank {rank} refused to start: {e}"}
    store.set(f"ready/{rank}", json.dumps(status))
    _wait_keys(store, [f"ready/{r}" for r in range(world)], args.startup_timeout, f"rank {rank}: start-up")
    statuses = [json.loads(store.get(f"ready/{r}")) for r in range(world)]
    store.set(f"seen/{rank}", "1")
    bad = [s["why"] for s in statuses if not s["ok"]]
    if bad and rank == 0:  # the store lives here: let every node read why before leaving
        try:
            _wait_keys(store, [f"seen/{r}" for r in range(world)], 5.0, "rank 0: refusing")
        except NodeError:
            pass
    if bad:
        raise NodeError("; ".join(bad))
    for r, s in enumerate(statuses):
        if (s["model_hash"], s["fingerprint"]) != (status["model_hash"], status["fingerprint"]):
            raise NodeError(f"rank {r} holds shards of another export (model hash {s['model_hash']}, fingerprint "
                            f"{s['fingerprint']}), rank {rank} has {status['model_hash']}/{status['fingerprint']}")

    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=args.timeout))
    wd = Watchdog(addr, port, rank, world, args.timeout)
    wd.store = dist.PrefixStore("disco/" + prefix, wd.store)
    wd.start()
    part, plan = state.part, state.plan
    link = LinkModel(parse_bandwidth(args.bandwidth), parse_latency(args.latency))
    tr = DistTransport(rank, world, codec=codec, link=link, n_links=part.n_links, values_per_link=part.links.values,
                       cdims={ex.tag: ex.cdim for ex in plan.exchanges.values()})
    ex = Executor(plan, state.gm, state.weights, tr)
    inputs = [x] if rank == 0 else None
    data_metrics = None
    if args.data:
        data_metrics = _run_data(args, man, ex, store, rank, x)
        tr.reset_counters()  # the report's byte counts are per inference
    lat: list[float] = []
    first = None
    per_inf: dict[str, int] = {}
    n_done = 0
    try:
        for k in range(args.warmup + args.iters):
            if args.fail_rank == rank and n_done >= args.fail_after:
                os.kill(os.getpid(), signal.SIGKILL)
            t0 = time.perf_counter()
            out = ex.run(inputs)
            lat.append(time.perf_counter() - t0)
            n_done += 1
            if k == 0:
                first = out
                per_inf = tr.counters()
        stream_s = None
        if args.stream > 0:
            tr.flush()
            t0 = time.perf_counter()
            futs: list[Any] = []
            for _ in range(args.iters):
                futs.append(ex.start(inputs, flush=rank != 0))
                if len(futs) > args.stream:
                    futs.pop(0)()
            for f in futs:
                f()
            tr.flush()
            stream_s = time.perf_counter() - t0
    except PeerError as e:
        wd.stop.set()
        _die(rank, str(e), wd.store)
    tr.close()
    stats = {"rank": rank, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
             "weight_bytes": state.weight_bytes, "params": int(sum(s["params"] for s in man["shards"]
                                                                   if s["rank"] == rank)),
             "payload_bytes": per_inf.get("payload_bytes", 0), "overhead_bytes": per_inf.get("overhead_bytes", 0),
             "other_bytes": per_inf.get("other_bytes", 0), "stats_bytes": per_inf.get("stats_bytes", 0),
             "messages": per_inf.get("messages", 0)}
    store.set(f"stats/{rank}", json.dumps(stats))
    if rank != 0:
        wd.stop.set()  # rank 0 may exit as soon as every node is done
    store.set(f"done/{rank}", "1")
    report = None
    if rank == 0:
        _wait_keys(store, [f"done/{r}" for r in range(world)], args.timeout, "rank 0: finishing")
        all_stats = [json.loads(store.get(f"stats/{r}")) for r in range(world)]
        timed = lat[args.warmup:] or lat
        err = None
        if ref is not None:
            err = compare_reference(first, ref)
        bpv = codec.bytes_per_value
        report = {
            "nodes": world, "model": man["model"]["name"], "input_shape": man["input_shape"], "codec": codec.name,
            "ratio": man["ratio"], "bandwidth_mbit": None if link.bandwidth_bps is None else link.bandwidth_bps / 1e6,
            "latency_s": link.latency_s, "shaping": "pacing" if link.shaped else None,
            "latency_ms_median": float(np.median(timed) * 1e3), "latency_ms_all": [t * 1e3 for t in timed],
            "throughput_per_s": (args.iters / stream_s) if stream_s else float(1.0 / np.median(timed)),
            "stream": args.stream,
            "bytes_sent_total": int(sum(s["payload_bytes"] for s in all_stats)),
            "bytes_predicted": int(man["bytes_predicted"] // 4 * bpv),
            "bytes_codec_overhead": int(sum(s["overhead_bytes"] for s in all_stats)),
            "bytes_input_output": int(sum(s["other_bytes"] for s in all_stats)),
            "bytes_stats": int(sum(s.get("stats_bytes", 0) for s in all_stats)),
            "bytes_stats_predicted": int(man.get("stats_bytes", 0)),
            "max_rel_err_vs_single_process": err,
            "peak_rss_mb_per_node": [s["peak_rss_mb"] for s in all_stats],
            "weight_bytes_per_node": [s["weight_bytes"] for s in all_stats],
            "params_per_node": [s["params"] for s in all_stats], "params_dense": man["params_dense"],
            "messages_per_inference": int(sum(s["messages"] for s in all_stats)),
        }
        if data_metrics is not None:
            report["data"] = data_metrics
        if args.result:
            Path(args.result).write_text(json.dumps(report))
    wd.stop.set()
    try:
        dist.destroy_process_group()
    except Exception:  # shutting down anyway
        pass
    return report


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    rank = args.rank if args.rank is not None else os.environ.get("RANK", "?")
    try:
        report = run_node(args)
    except NodeError as e:
        print(f"disco node {rank}: error: {e}", file=sys.stderr, flush=True)
        refused = "refused" in str(e) or "input" in str(e)
        os._exit(EXIT_REFUSED if refused else EXIT_PEER)
    except Exception as e:  # the store (hosted by rank 0) or gloo failed outside a transfer
        first = str(e).strip().splitlines()[-1][:200] if str(e).strip() else ""
        lost = "lost rank 0 (the leader's store closed): " if "DistNetwork" in type(e).__name__ else ""
        print(f"disco node {rank}: error: {lost}{type(e).__name__}: {first}", file=sys.stderr, flush=True)
        os._exit(EXIT_PEER)
    if report is not None and not args.result:
        print(json.dumps(report))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown of gloo threads


if __name__ == "__main__":
    sys.exit(main())
