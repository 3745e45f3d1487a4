"""Rendezvous of the nodes of one run: the TCP store under the run's token, deadlines on every store call,
the start-up agreement (all ready, one export) and the watchdog that ends a node whose peer is lost.

Every blocking call has a deadline: store calls run under one (a leader that stops answering is named,
rank 0), and the heartbeat thread ends every node with exit code 3 and an error naming the lost rank when a
peer is silent for ``--timeout`` seconds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..errors import EXIT_FAILED, RefusedError, RunFailure

log = logging.getLogger("disco.node")

TOKEN_ENV = "DISCO_RUN_TOKEN"
PARENT_ENV = "DISCO_LAUNCHER_PID"


def env_int(name: str, default: int | None) -> int | None:
    """An integer environment variable (``default`` when unset or empty)."""
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else default

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


def listen_socket(addr: str, port: int) -> socket.socket:
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


def tcp_store(addr: str, port: int, world: int, timeout: float, master: bool) -> Any:
    """The rendezvous store: rank 0 serves it on ``addr:port`` only; the others connect within ``timeout``."""
    import torch.distributed as dist

    listen = listen_socket(addr, port) if master else None

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


def wait_keys(store: DeadlineStore, keys: list[str], timeout: float, what: str) -> None:
    """Wait until every key is in the store; after ``timeout`` s name the ranks whose keys are missing."""
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


# ---- watchdog -----------------------------------------------------------------------------

class Watchdog:
    """Heartbeats through the store; ends this process when a peer stops, the store stops answering,
    another node failed, or the launcher that started this node is gone."""

    def __init__(self, store: DeadlineStore, rank: int, world: int, timeout: float) -> None:
        self.rank, self.world, self.timeout, self.store = rank, world, timeout, store
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="disco-watchdog", daemon=True)
        self.parent = env_int(PARENT_ENV, None)

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
                    die(self.rank, str(e), None)
                return
            self.stop.wait(interval)

    def _beat(self, last: dict[int, tuple[int, float]]) -> None:
        if self.parent is not None and os.getppid() != self.parent:
            die(self.rank, f"the launcher (pid {self.parent}) is gone", self.store)
        self.store.add(f"hb/{self.rank}", 1)
        if self.store.check(["failed"]):
            die(self.rank, f"stopping: {self.store.get('failed').decode()}", None)
        now = time.monotonic()
        for r in range(self.world):
            if r == self.rank or self.store.check([f"done/{r}"]):
                continue
            v = self.store.add(f"hb/{r}", 0)
            if r not in last or last[r][0] != v:
                last[r] = (v, now)
            elif now - last[r][1] > self.timeout:
                die(self.rank, f"lost rank {r}: no heartbeat for {now - last[r][1]:.1f} s", self.store)


def publish(store: DeadlineStore | None, rank: int, why: str) -> None:
    """Tell the other nodes why this one stops, never waiting long for a store that may be gone."""
    if store is None:
        return
    try:
        with_deadline(lambda: store.store.set("failed", f"rank {rank} reported: {why}"), 1.0,
                      lambda: RunFailure("store busy"))
    except Exception:  # best effort
        pass


def die(rank: int, why: str, store: DeadlineStore | None) -> None:
    """Report and exit at once (gloo or a store call may be blocked in another thread)."""
    publish(store, rank, why)
    print(f"disco node {rank}: error: {why}", file=sys.stderr, flush=True)
    os._exit(EXIT_FAILED)

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
        rank = rank if rank is not None else env_int("RANK", None)
        world = world if world is not None else env_int("WORLD_SIZE", None)
        addr = addr or os.environ.get("MASTER_ADDR", "127.0.0.1")
        port = port if port is not None else env_int("MASTER_PORT", None)
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

        raw = tcp_store(self.addr, self.port, self.world, timeout, serve and self.rank == 0 and not self.agent_store)
        return DeadlineStore(dist.PrefixStore(self.prefix, raw), deadline)


def agree(store: DeadlineStore, ident: Identity, status: dict[str, Any], timeout: float) -> None:
    """Publish this node's status; wait for all; refuse if any refused or they hold different exports."""
    rank, world = ident.rank, ident.world
    store.set(f"ready/{rank}", json.dumps(status))
    wait_keys(store, [f"ready/{r}" for r in range(world)], timeout, "start-up")
    statuses = [json.loads(store.get(f"ready/{r}")) for r in range(world)]
    store.set(f"seen/{rank}", "1")
    bad = [s for s in statuses if not s["ok"]]
    if bad and rank == 0:  # the store lives here: let every node read why before leaving
        try:
            wait_keys(store, [f"seen/{r}" for r in range(world)], 5.0, "refusing")
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

