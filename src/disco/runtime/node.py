"""The node program: one process per node, the same under ``disco run`` and under torchrun.

    python -m disco.runtime.node DIR [--codec fp16] [--bandwidth 100mbit --latency 2ms] ...

Rendezvous through the environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), as torchrun
sets it; ``--rank/--world-size/--master-addr/--master-port`` override it. The nodes of one run
share a token (``DISCO_RUN_TOKEN``: the launcher draws one per run; under torchrun export the
same value on every machine); every key they write lives under it, so a process without it
is never seen as a peer. Start-up: every node joins a TCP store that listens only on the
given address (bounded by ``--startup-timeout``), loads and verifies its own shard and the
manifest (the leader also checks the input), and reports ready or the reason it refuses;
only when all N are ready, and agree on the export, does torch.distributed (gloo) start.

Every blocking call has a deadline: store calls run under one (a leader that stops answering
is named, rank 0), gloo under ``--timeout`` + 3 s, and a heartbeat thread ends every node
with exit code 3 and an error naming the lost rank when a peer is silent for ``--timeout``
seconds. Exit codes come from the exception type (:mod:`disco.errors`): 2 refused,
3 failed during the run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import pickle
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import EXIT_FAILED, RefusedError, RunFailure, exit_code
from .options import RunOptions

log = logging.getLogger("disco.node")

TOKEN_ENV = "DISCO_RUN_TOKEN"
PARENT_ENV = "DISCO_LAUNCHER_PID"
GLOO_SLACK_S = 3.0  # gloo's own deadline is later than the watchdog's, so the watchdog names the lost rank


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
    RunOptions.add_arguments(p)
    p.add_argument("--result", help="the leader writes its JSON report here")
    return p


def add_run_options(p: argparse.ArgumentParser) -> None:
    """Options shared by the node program and ``disco run`` (the fields of :class:`RunOptions`)."""
    RunOptions.add_arguments(p)


# ---- deadlines on the store ---------------------------------------------------------------

def with_deadline(fn: Callable[[], Any], seconds: float, on_timeout: Callable[[], BaseException]) -> Any:
    """``fn()`` on a helper thread; raise ``on_timeout()`` if it has not returned after ``seconds``.

    A TCPStore client call to a stopped (SIGSTOP) server never returns and holds the client's lock;
    the helper thread is left behind (a daemon) and the caller gets its error in bounded time.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["v"] = fn()
        except BaseException as e:  # handed to the caller
            box["e"] = e

    t = threading.Thread(target=target, name="disco-store-call", daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise on_timeout()
    if "e" in box:
        raise box["e"]
    return box["v"]


class DeadlineStore:
    """A store (hosted by rank 0) whose every call ends within ``timeout`` seconds or raises :class:`RunFailure`."""

    def __init__(self, store: Any, timeout: float) -> None:
        self.store, self.timeout = store, timeout

    def _call(self, op: str, *a: Any) -> Any:
        def lost() -> RunFailure:
            return RunFailure(f"lost rank 0: its store did not answer for {self.timeout:.0f} s "
                              "(rank 0 stopped or unreachable)")

        try:
            return with_deadline(lambda: getattr(self.store, op)(*a), self.timeout, lost)
        except RunFailure:
            raise
        except Exception as e:  # the store lives in rank 0: its connection closed
            first = str(e).strip().splitlines()[0][:100] if str(e).strip() else type(e).__name__
            raise RunFailure(f"lost rank 0: its store closed the connection ({first})") from e

    def set(self, key: str, value: str) -> None:
        self._call("set", key, value)

    def get(self, key: str) -> bytes:
        return self._call("get", key)

    def check(self, keys: list[str]) -> bool:
        return self._call("check", keys)

    def add(self, key: str, n: int) -> int:
        return self._call("add", key, n)


def _listen_socket(addr: str, port: int) -> socket.socket:
    """A socket listening on ``addr:port`` only (the store's server takes it over)."""
    info = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
    s = socket.socket(info[0], socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(info[4])
        s.listen(128)
    except OSError as e:
        s.close()
        raise RunFailure(f"cannot listen on {addr}:{port}: {'port already in use' if e.errno == 98 else e}") from e
    return s


_LISTENING: list[socket.socket] = []


def _store(addr: str, port: int, world: int, timeout: float, master: bool) -> Any:
    """The rendezvous store: rank 0 serves it on ``addr:port`` only; the others connect within ``timeout``."""
    import torch.distributed as dist

    listen = _listen_socket(addr, port) if master else None

    def make() -> Any:
        return dist.TCPStore(addr, port, world, is_master=master, timeout=timedelta(seconds=timeout),
                             wait_for_workers=False, master_listen_fd=None if listen is None else listen.fileno())

    def late() -> RunFailure:
        return RunFailure(f"cannot reach the leader's store at {addr}:{port} within {timeout:.0f} s (is rank 0 "
                          "running, and is that port its own, not another program's?)")

    try:
        store = with_deadline(make, timeout + 1.0, late)
    except RunFailure:
        raise
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if master:
            raise RunFailure(f"cannot start the rendezvous store on {addr}:{port}: {msg}") from e
        raise RunFailure(f"cannot reach the leader's store at {addr}:{port} within {timeout:.0f} s "
                         f"(is rank 0 running?): {msg}") from e
    if listen is not None:
        _LISTENING.append(listen)  # keep the socket open as long as the process lives
    return store


def _wait_keys(store: DeadlineStore, keys: list[str], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        missing = [k for k in keys if not store.check([k])]
        if not missing:
            return
        if time.monotonic() > deadline:
            ranks = sorted({k.rsplit("/", 1)[-1] for k in missing})
            raise RunFailure(f"{what}: no word from rank{'s' if len(ranks) > 1 else ''} {', '.join(ranks)} "
                             f"({', '.join(missing)} not there after {timeout:.0f} s: missing or stopped peer, "
                             f"or a peer without this run's {TOKEN_ENV}?)")
        time.sleep(0.05)


def _load_input(path: str | None, man: dict[str, Any], d: Path) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
    """The input tensor and, for the export's probe, the single-process reference outputs (by name)."""
    from safetensors.torch import load_file

    ref = None
    try:
        if path is None:
            f = d / "reference.safetensors"
            if not f.is_file():
                raise RefusedError(f"{d} has no reference.safetensors; pass --input")
            from .export import file_sha256

            if file_sha256(f) != man["reference_sha256"]:
                raise RefusedError(f"{d / 'manifest.json'}: field 'reference_sha256' does not match {f.name}")
            t = load_file(str(f))
            x = t.pop("input")
            ref = t
        elif path.endswith(".safetensors"):
            t = load_file(path)
            x = t.get("input", next(iter(t.values())))
        elif path.endswith(".npy"):
            x = torch.from_numpy(np.load(path, allow_pickle=False))
        else:
            x = torch.load(path, map_location="cpu", weights_only=True)
    except RefusedError:
        raise
    except Exception as e:  # missing, damaged or not a tensor file
        why = ("not a tensor file (.safetensors with 'input', .pt of a tensor, .npy)"
               if isinstance(e, pickle.UnpicklingError) else str(e).splitlines()[0] if str(e) else "")
        raise RefusedError(f"cannot read input {path or d / 'reference.safetensors'}: "
                           f"{type(e).__name__}: {why}") from e
    check_input(x, man)
    return x, ref


def check_input(x: Any, man: dict[str, Any]) -> None:
    """Refuse an input that is not a float32 tensor of the exported input shape."""
    if not isinstance(x, torch.Tensor):
        raise RefusedError(f"input must be a tensor, got {type(x).__name__}")
    want = tuple(man["input_shape"])
    if tuple(x.shape) != want:
        raise RefusedError(f"input has shape {tuple(x.shape)}, the model was exported for {want}")
    if x.dtype != torch.float32:
        raise RefusedError(f"input has dtype {x.dtype}, expected torch.float32")


# ---- watchdog -----------------------------------------------------------------------------

class Watchdog:
    """Heartbeats through the store; ends this process when a peer stops, the store stops answering,
    another node failed, or the launcher that started this node is gone."""

    def __init__(self, store: DeadlineStore, rank: int, world: int, timeout: float) -> None:
        self.rank, self.world, self.timeout, self.store = rank, world, timeout, store
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="disco-watchdog", daemon=True)
        self.parent = _env_int(PARENT_ENV, None)

    def start(self) -> None:
        self.thread.start()

    def _loop(self) -> None:
        interval = max(0.05, min(0.5, self.timeout / 10))
        last: dict[int, tuple[int, float]] = {}
        while not self.stop.is_set():
            try:
                self._beat(last)
            except RunFailure as e:
                if not self.stop.is_set():
                    _die(self.rank, str(e), None)
                return
            self.stop.wait(interval)

    def _beat(self, last: dict[int, tuple[int, float]]) -> None:
        if self.parent is not None and os.getppid() != self.parent:
            _die(self.rank, f"the launcher (pid {self.parent}) is gone", self.store)
        self.store.add(f"hb/{self.rank}", 1)
        if self.store.check(["failed"]):
            _die(self.rank, f"stopping: {self.store.get('failed').decode()}", None)
        now = time.monotonic()
        for r in range(self.world):
            if r == self.rank or self.store.check([f"done/{r}"]):
                continue
            v = self.store.add(f"hb/{r}", 0)
            if r not in last or last[r][0] != v:
                last[r] = (v, now)
            elif now - last[r][1] > self.timeout:
                _die(self.rank, f"lost rank {r}: no heartbeat for {now - last[r][1]:.1f} s", self.store)


def _publish(store: DeadlineStore | None, rank: int, why: str) -> None:
    """Tell the other nodes why this one stops, never waiting long for a store that may be gone."""
    if store is None:
        return
    try:
        with_deadline(lambda: store.store.set("failed", f"rank {rank} reported: {why}"), 1.0,
                      lambda: RunFailure("store busy"))
    except Exception:  # best effort
        pass


def _die(rank: int, why: str, store: DeadlineStore | None) -> None:
    """Report and exit at once (gloo or a store call may be blocked in another thread)."""
    _publish(store, rank, why)
    print(f"disco node {rank}: error: {why}", file=sys.stderr, flush=True)
    os._exit(EXIT_FAILED)


def _inject(opts: RunOptions, rank: int) -> None:
    """Fault injection: this process sends itself SIGKILL or SIGSTOP, saying when on stderr."""
    sig = signal.Signals["SIG" + opts.fail_signal.upper().removeprefix("SIG")]
    now = time.time()
    print(f"disco node {rank}: fault injection: {sig.name} at {now:.3f}", file=sys.stderr, flush=True)
    if os.environ.get("DISCO_FAULT_LOG"):  # bench/faults.py times the exit from here
        with open(os.environ["DISCO_FAULT_LOG"], "a") as f:
            f.write(f"{now:.3f}\n")
    os.kill(os.getpid(), sig)


# ---- start-up -----------------------------------------------------------------------------

@dataclass
class Identity:
    """Which node this process is, and where the rendezvous is."""

    rank: int
    world: int
    addr: str
    port: int
    prefix: str  # every key of this run lives under it (the run token)
    agent_store: bool  # torchrun's agent hosts the store

    @classmethod
    def resolve(cls, rank: int | None, world: int | None, addr: str | None, port: int | None) -> Identity:
        rank = rank if rank is not None else _env_int("RANK", None)
        world = world if world is not None else _env_int("WORLD_SIZE", None)
        addr = addr or os.environ.get("MASTER_ADDR", "127.0.0.1")
        port = port if port is not None else _env_int("MASTER_PORT", None)
        if rank is None or world is None or port is None:
            raise RefusedError("rank, world size and master port are needed (RANK, WORLD_SIZE, MASTER_PORT "
                               "or options)")
        if not 0 <= rank < world:
            raise RefusedError(f"rank {rank} is outside 0..{world - 1}")
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        token = os.environ.get(TOKEN_ENV, "")
        if not token:
            log.warning("%s is not set: the nodes' keys are not protected by a per-run token", TOKEN_ENV)
        run_id = os.environ.get("DISCO_RUN_ID", "") + "/" if agent else ""
        tag = hashlib.sha256(token.encode()).hexdigest()[:32] if token else "open"
        return cls(rank, world, addr, port, f"disco/{run_id}{tag}/", agent)

    def connect(self, timeout: float, deadline: float, serve: bool = False) -> DeadlineStore:
        """A store client under this run's prefix, every call bounded by ``deadline`` seconds; with ``serve``
        rank 0 also hosts the store (unless torchrun's agent does)."""
        import torch.distributed as dist

        raw = _store(self.addr, self.port, self.world, timeout, serve and self.rank == 0 and not self.agent_store)
        return DeadlineStore(dist.PrefixStore(self.prefix, raw), deadline)


def _prepare(d: Path, opts: RunOptions, ident: Identity) -> tuple[dict[str, Any], Any, Any, Any, Any]:
    """Read and verify the manifest and this node's shard (the leader: also the input)."""
    from .export import load_node, read_manifest
    from .transport import get_codec

    man = read_manifest(d)
    state = load_node(d, ident.rank, ident.world)
    try:
        codec = get_codec(opts.codec or man["codec"])
    except ValueError as e:
        raise RefusedError(str(e)) from None
    x = ref = None
    if ident.rank == 0:
        x, ref = _load_input(opts.input, man, d)
    return man, state, codec, x, ref


def _agree(store: DeadlineStore, ident: Identity, status: dict[str, Any], timeout: float) -> None:
    """Publish this node's status; wait for all; refuse if any refused or they hold different exports."""
    rank, world = ident.rank, ident.world
    store.set(f"ready/{rank}", json.dumps(status))
    _wait_keys(store, [f"ready/{r}" for r in range(world)], timeout, "start-up")
    statuses = [json.loads(store.get(f"ready/{r}")) for r in range(world)]
    store.set(f"seen/{rank}", "1")
    bad = [s for s in statuses if not s["ok"]]
    if bad and rank == 0:  # the store lives here: let every node read why before leaving
        try:
            _wait_keys(store, [f"seen/{r}" for r in range(world)], 5.0, "refusing")
        except RunFailure:
            pass
    if bad:
        by_why: dict[str, list[int]] = {}
        for r, s in enumerate(statuses):
            if not s["ok"]:
                by_why.setdefault(s["why"], []).append(r)
        why = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))} refused to start: {w}"
                        for w, rs in by_why.items())
        raise RefusedError(why) if all(s["refused"] for s in bad) else RunFailure(why)
    keys = ("model_hash", "fingerprint", "manifest_hash")
    for r, s in enumerate(statuses):
        if any(s.get(k) != status.get(k) for k in keys):
            raise RefusedError(f"rank {r} holds another export (model hash {s['model_hash']}, manifest hash "
                               f"{s.get('manifest_hash')}); rank {rank} has {status['model_hash']}, "
                               f"{status.get('manifest_hash')}")


# ---- main ---------------------------------------------------------------------------------

PROGRESS_ENV = "DISCO_PROGRESS"  # the launcher's progress file: the leader writes "done total" into it


class _Progress:
    """Writes "done total" to the launcher's progress file at most every 0.2 s (nothing without one)."""

    def __init__(self, path: str | None, total: int) -> None:
        self.path, self.total, self.done, self.last = path, total, 0, 0.0
        self._write()

    def step(self) -> None:
        self.done += 1
        if self.done == self.total or time.monotonic() - self.last > 0.2:
            self._write()

    def _write(self) -> None:
        if self.path:
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                f.write(f"{self.done} {self.total}")
            os.replace(tmp, self.path)
            self.last = time.monotonic()


def _run_data(opts: RunOptions, man: dict[str, Any], ex: Any, store: DeadlineStore, rank: int) -> dict[str, Any] | None:
    """Run the task's test split through the split model (the leader feeds it; the others follow)."""
    if rank != 0:
        _wait_keys(store, ["data/n"], opts.timeout, "waiting for the data count")
        for _ in range(int(store.get("data/n"))):
            ex.run(None)
        return None
    from ..tasks import get_task

    task = get_task(man.get("task") or "cifar10")
    _, test = task.loaders(opts.data, int(man["input_shape"][0]), limit=opts.limit)
    b = int(man["input_shape"][0])  # the split model runs at its exported batch size
    batches = [(xb[i:i + b], yb[i:i + b]) for xb, yb in test for i in range(0, len(yb) - b + 1, b)]
    store.set("data/n", str(len(batches)))
    outs, targets = [], []
    progress = _Progress(os.environ.get(PROGRESS_ENV), len(batches))
    for xb, yb in batches:
        outs.append(ex.run([xb.contiguous()]))
        targets.append(yb)
        progress.step()

    class _Replay(torch.nn.Module):  # feeds the recorded distributed outputs to the task's metric
        def __init__(self) -> None:
            super().__init__()
            self.k = 0

        def forward(self, _x: torch.Tensor) -> torch.Tensor:
            self.k += 1
            return outs[self.k - 1]

    metrics = task.evaluate(_Replay(), list(zip([b[0] for b in batches], targets, strict=True)))
    return {"task": task.name, **metrics, "n": len(batches) * b}


def rss_mb() -> float:
    """This process's resident memory now (MB), from /proc (0 where there is none)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def _timed(opts: RunOptions, ex: Any, tr: Any, inputs: list[torch.Tensor] | None, rank: int
           ) -> tuple[list[float], Any, dict[str, int], float | None, list[float]]:
    """Warm-up and timed inferences, then the stream: latencies, first output, per-inference counters,
    the stream's seconds and this node's RSS (MB) sampled 40 times along the stream."""
    lat: list[float] = []
    first = None
    per_inf: dict[str, int] = {}
    k = 0
    for k in range(opts.warmup + opts.iters):
        if opts.fail_rank == rank and opts.fail_at == "run" and k == opts.fail_after:
            _inject(opts, rank)
        t0 = time.perf_counter()
        out = ex.run(inputs)
        lat.append(time.perf_counter() - t0)
        if k == 0:
            first = out
            per_inf = tr.counters()
    stream_s, rss = None, []
    if opts.stream > 0:
        tr.flush()
        every = max(1, opts.iters // 40)
        t0 = time.perf_counter()
        futs: list[Any] = []
        for i in range(opts.iters):
            if opts.fail_rank == rank and opts.fail_at == "stream" and i == opts.fail_after:
                _inject(opts, rank)
            futs.append((ex.start(inputs, flush=rank != 0), tr.mark()))
            if len(futs) > opts.stream:
                finish, mark = futs.pop(0)
                finish()  # its output is back: every send of that inference was received
                tr.settle(mark)
            if i % every == 0:
                rss.append(round(rss_mb(), 2))
        for finish, _ in futs:
            finish()
        tr.flush()
        stream_s = time.perf_counter() - t0
        rss.append(round(rss_mb(), 2))
    return lat, first, per_inf, stream_s, rss


def run_node(d: str | Path, opts: RunOptions | None = None, rank: int | None = None, world: int | None = None,
             addr: str | None = None, port: int | None = None, result: str | None = None) -> dict[str, Any] | None:
    """Start-up, run, report. Returns the leader's report (None on other ranks).

    Raises :class:`RefusedError` (nothing computed) or :class:`RunFailure`; a lost peer during the
    run ends the process at once with exit code 3 (gloo may be blocked in another thread)."""
    import torch.distributed as dist

    from .executor import Executor
    from .transport import DistTransport, LinkModel, PeerError, lower_io_threads, parse_bandwidth, parse_latency

    opts = opts or RunOptions()
    ident = Identity.resolve(rank, world, addr, port)
    rank, world = ident.rank, ident.world
    torch.set_num_threads(opts.threads)
    d = Path(d)
    store = ident.connect(opts.startup_timeout, max(opts.startup_timeout, opts.timeout), serve=True)
    store.set(f"joined/{rank}", "1")
    if opts.fail_rank == rank and opts.fail_at == "startup":
        _inject(opts, rank)
    _wait_keys(store, [f"joined/{r}" for r in range(world)], opts.startup_timeout, "start-up")

    # load and verify before any compute; tell the others why we refuse
    try:
        man, state, codec, x, ref = _prepare(d, opts, ident)
        status: dict[str, Any] = {"ok": True, "model_hash": man["model_hash"], "fingerprint": man["fingerprint"],
                                  "manifest_hash": man.get("manifest_hash")}
    except Exception as e:
        status = {"ok": False, "why": str(e) or type(e).__name__, "refused": isinstance(e, ValueError)}
    _agree(store, ident, status, opts.startup_timeout)

    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store.store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=opts.timeout + GLOO_SLACK_S))
    lower_io_threads(opts.io_nice)
    wd = Watchdog(ident.connect(opts.startup_timeout, opts.timeout), rank, world, opts.timeout)
    wd.start()
    part, plan = state.part, state.plan
    link = LinkModel(parse_bandwidth(opts.bandwidth), parse_latency(opts.latency))
    tr = DistTransport(rank, world, codec=codec, link=link, n_links=part.n_links, values_per_link=part.links.values,
                       cdims={ex.tag: ex.cdim for ex in plan.exchanges.values()})
    ex = Executor(plan, state.gm, state.weights, tr)
    inputs = [x] if rank == 0 else None
    try:
        data_metrics = _run_data(opts, man, ex, store, rank) if opts.data else None
        tr.reset_counters()  # the report's byte counts are per inference
        lat, first, per_inf, stream_s, rss = _timed(opts, ex, tr, inputs, rank)
    except (PeerError, RunFailure) as e:
        wd.stop.set()
        _die(rank, str(e), wd.store)
    except Exception as e:  # e.g. a refused data folder: tell the others, then exit with this error's code
        wd.stop.set()
        _publish(wd.store, rank, f"{type(e).__name__}: {e}")
        raise
    tr.close()
    stats = {"rank": rank, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
             "rss_mb_stream": rss,
             "weight_bytes": state.weight_bytes,
             "params": int(sum(s["params"] for s in man["shards"] if s["rank"] == rank)),
             **{k: per_inf.get(k, 0) for k in ("payload_bytes", "overhead_bytes", "other_bytes", "stats_bytes",
                                               "messages")}}
    store.set(f"stats/{rank}", json.dumps(stats))
    if rank != 0:
        wd.stop.set()  # rank 0 may exit as soon as every node is done
    store.set(f"done/{rank}", "1")
    report = None
    if rank == 0:
        _wait_keys(store, [f"done/{r}" for r in range(world)], opts.timeout, "finishing")
        all_stats = [json.loads(store.get(f"stats/{r}")) for r in range(world)]
        report = _report(opts, man, codec, link, lat, first, ref, stream_s, all_stats, data_metrics)
        if result:
            Path(result).write_text(json.dumps(report))
    wd.stop.set()
    try:
        dist.destroy_process_group()
    except Exception:  # shutting down anyway
        pass
    return report


def _report(opts: RunOptions, man: dict[str, Any], codec: Any, link: Any, lat: list[float], first: Any,
            ref: dict[str, torch.Tensor] | None, stream_s: float | None, all_stats: list[dict[str, Any]],
            data_metrics: dict[str, Any] | None) -> dict[str, Any]:
    from .proof import run_error

    timed = lat[opts.warmup:] or lat
    report = {
        "nodes": len(all_stats), "model": man["model"]["name"], "input_shape": man["input_shape"],
        "codec": codec.name, "ratio": man["ratio"],
        "bandwidth_mbit": None if link.bandwidth_bps is None else link.bandwidth_bps / 1e6,
        "latency_s": link.latency_s, "shaping": "pacing" if link.shaped else None,
        "latency_ms_median": float(np.median(timed) * 1e3), "latency_ms_all": [t * 1e3 for t in timed],
        "throughput_per_s": (opts.iters / stream_s) if stream_s else float(1.0 / np.median(timed)),
        "stream": opts.stream,
        "bytes_sent_total": int(sum(s["payload_bytes"] for s in all_stats)),
        "bytes_predicted": int(man["bytes_predicted"] // 4 * codec.bytes_per_value),
        "bytes_codec_overhead": int(sum(s["overhead_bytes"] for s in all_stats)),
        "bytes_input_output": int(sum(s["other_bytes"] for s in all_stats)),
        "bytes_stats": int(sum(s.get("stats_bytes", 0) for s in all_stats)),
        "bytes_stats_predicted": int(man.get("stats_bytes", 0)),
        "max_rel_err_vs_single_process": None if ref is None else run_error(first, ref, man),
        "proof": man.get("proof"),
        "peak_rss_mb_per_node": [s["peak_rss_mb"] for s in all_stats],
        "rss_mb_stream_per_node": [s["rss_mb_stream"] for s in all_stats],
        "weight_bytes_per_node": [s["weight_bytes"] for s in all_stats],
        "params_per_node": [s["params"] for s in all_stats], "params_dense": man["params_dense"],
        "messages_per_inference": int(sum(s["messages"] for s in all_stats)),
    }
    if data_metrics is not None:
        report["data"] = data_metrics
    return report


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    rank = args.rank if args.rank is not None else os.environ.get("RANK", "?")
    try:
        report = run_node(args.dir, RunOptions.from_args(args), args.rank, args.world_size, args.master_addr,
                          args.master_port, args.result)
    except (RefusedError, RunFailure) as e:
        print(f"disco node {rank}: error: {e}", file=sys.stderr, flush=True)
        os._exit(exit_code(e))
    except Exception as e:  # gloo or the store failed outside a transfer
        text = str(e).strip()
        first = text.splitlines()[-1][:200] if text else ""
        lost = "lost rank 0 (the leader's store closed): " if "DistNetwork" in type(e).__name__ else ""
        print(f"disco node {rank}: error: {lost}{type(e).__name__}: {first}", file=sys.stderr, flush=True)
        os._exit(exit_code(e) if isinstance(e, ValueError) else EXIT_FAILED)
    if report is not None and not args.result:
        print(json.dumps(report))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown of gloo threads


if __name__ == "__main__":
    sys.exit(main())
