"""ZeroMQ transport between the nodes of one run: rendezvous, authentication, tagged messages, pacing.

Each node binds one ROUTER socket (its inbox) and connects one DEALER per peer (routing id ``r<rank>``), so each
peer has its own queue in both directions and ZeroMQ's I/O thread receives while the node computes. Frames:

    [b"H", mac, hello-json]   first message on every connection: HMAC-SHA256 of the rank with the run token
    [b"D", tag + seq (2 x int64 LE), payload]   a data message (payload: the coded value's bytes, sent zero-copy;
                              seq: the number of the inference it belongs to)
    [b"C", json]              control: the peer table, go / end of inferences, the final report
    [b"X", reason]            the sender stops because of ``reason``
    [b"R", reason]            the receiver is refused (a served group: its rank is live in the group already)

A connection's routing id is ``r<rank>:<nonce>`` (a nonce per process): messages of a process that has been
replaced by a restarted one of the same rank are told apart and dropped.

Rendezvous: rank 0 binds at the leader's address; the others bind anywhere, say hello to the leader with their
address and get the table back. With an explicit ``peers`` list every rank binds its own entry.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import queue
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq

from .errors import Aborted, Failed, PeerLost, Refused
from .link import LinkModel, Pacing

log = logging.getLogger(__name__)
_TAG = struct.Struct("<qqd")  # tag, seq, the pacer's release time (perf_counter s; 0: not paced)
CLOCK_SKEW_S = 60.0  # a release time further than this from now is another host's clock: taken as "now"
CHECK_S = 0.1  # a wait looks at the connections' events after this long without a message
GONE_GRACE_S = 0.5  # a peer whose connection closed is lost once this long has passed without its message


def _ident(rank: int, nonce: str) -> bytes:
    return b"r%d:%s" % (rank, nonce.encode())


def _rank_of(ident: bytes) -> int:
    try:
        return int(ident[1:].split(b":")[0].decode()) if ident[:1] == b"r" else -1
    except ValueError:
        return -1


def mac(token: str, rank: int) -> bytes:
    """The proof that a peer holds the run token (bound to the rank it claims)."""
    return hmac.new(token.encode(), b"disco-edge/1 rank %d" % rank, hashlib.sha256).digest()


class ZmqTransport:
    """Point-to-point tagged messages to and from the other ranks (not thread-safe: one caller)."""

    def __init__(self, rank: int, nodes: int, token: str, link: LinkModel | None = None,
                 timeout: float = 20.0) -> None:
        self.rank, self.nodes, self.token, self.timeout = rank, nodes, token, timeout
        self.ctx = zmq.Context(io_threads=1)
        self.inbox = self.ctx.socket(zmq.ROUTER)
        self.inbox.setsockopt(zmq.LINGER, 0)
        self.inbox.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.out: dict[int, zmq.Socket] = {}
        self.addrs: list[str] = []
        self.known: set[int] = set()  # peers whose hello verified
        self.idents: dict[int, bytes] = {}  # the routing id of each peer's current connection
        self.nonce = os.urandom(4).hex()
        self.serving = False  # a served group: a stranger's message is dropped and logged, not fatal
        self.abort_upto = -1  # rank 0 abandoned every inference up to this number (a served group)
        self.monitors: dict[int, zmq.Socket] = {}  # events of the connection to each peer
        self.gone: dict[int, float] = {}  # peers whose connection closed, since when
        self.parent: int | None = None  # the launcher's pid (``disco run``): its end ends this node
        self.stash: dict[tuple[int, Any], deque] = {}
        self.pacing = Pacing(link or LinkModel())
        self.messages = 0
        self._q: queue.Queue | None = None
        self._error: BaseException | None = None
        if self.pacing.link.shaped:
            self._q = queue.Queue()
            threading.Thread(target=self._pace_loop, name="disco-pacer", daemon=True).start()

    # ---- start-up ---------------------------------------------------------------------------
    def bind(self, addr: str) -> str:
        """Bind the inbox at ``host:port`` (port 0: any free one); returns the ``tcp://`` address bound."""
        host, _, port = addr.rpartition(":")
        try:
            if port in ("", "0"):
                p = self.inbox.bind_to_random_port(f"tcp://{host}")
                return f"tcp://{host}:{p}"
            self.inbox.bind(f"tcp://{host}:{port}")
        except zmq.ZMQError as e:
            raise Refused(f"cannot listen on {addr}: {e} (is the port in use, or not an address of this host?)"
                          ) from None
        return f"tcp://{host}:{port}"

    def _connect(self, peer: int, addr: str, hello: dict[str, Any]) -> None:
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.ROUTING_ID, _ident(self.rank, self.nonce))
        s.setsockopt(zmq.LINGER, 2000)
        self.monitors[peer] = s.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        s.connect(addr)
        s.send_multipart([b"H", mac(self.token, self.rank), json.dumps(hello).encode()])
        self.out[peer] = s

    def start_peers(self, peers: list[str]) -> None:
        """Explicit peer list: bind ``peers[rank]``, connect to every other one, wait for their hellos."""
        if len(peers) != self.nodes:
            raise Refused(f"--peers lists {len(peers)} addresses for {self.nodes} nodes; give one host:port "
                          "per rank, in rank order")
        self.bind(peers[self.rank])
        self.addrs = [f"tcp://{p}" for p in peers]
        for j in range(self.nodes):
            if j != self.rank:
                self._connect(j, self.addrs[j], {"rank": self.rank, "nodes": self.nodes})
        self._await_hellos(set(range(self.nodes)) - {self.rank}, "the peers")

    def start_leader(self, leader: str, host: str = "127.0.0.1") -> None:
        """Rendezvous at rank 0's address: the leader collects every rank's address and sends the table."""
        if self.rank == 0:
            self.addrs = [self.bind(leader)] + [""] * (self.nodes - 1)
            hellos = self._await_hellos(set(range(1, self.nodes)), "the rendezvous")
            for j, h in hellos.items():
                self.addrs[j] = h["addr"]
            for j in range(1, self.nodes):
                self._connect(j, self.addrs[j], {"rank": 0, "nodes": self.nodes})
                self.send_control(j, {"peers": self.addrs})
            return
        mine = self.bind(f"{host}:0")
        self._connect(0, f"tcp://{leader}", {"rank": self.rank, "nodes": self.nodes, "addr": mine})
        table = self.control(0, timeout=self.timeout)
        self.addrs = table["peers"]
        self.serving = bool(table.get("serve"))  # rank 0 serves requests: this node follows (disco_edge.follower)
        for j in range(1, self.nodes):
            if j != self.rank and self.addrs[j]:  # a served group sends the table before every rank has joined
                self._connect(j, self.addrs[j], {"rank": self.rank, "nodes": self.nodes})

    def _await_hellos(self, want: set[int], what: str) -> dict[int, dict[str, Any]]:
        got: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + self.timeout
        while not want <= self.known:
            left = deadline - time.monotonic()
            if left <= 0 or not self.inbox.poll(int(left * 1000) + 1):
                missing = sorted(want - self.known)
                raise Failed(f"{what}: no word from rank{'s' if len(missing) > 1 else ''} "
                             f"{', '.join(map(str, missing))} after {self.timeout:.0f} s (missing or stopped peer, "
                             "wrong address, or a peer of another run?)")
            src, hello = self._pump_one()
            if hello is not None:
                got[src] = hello
        return got

    # ---- receiving ----------------------------------------------------------------------------
    def _pump_one(self) -> tuple[int, dict[str, Any] | None]:
        """Read one message from the inbox into the stash; a hello is checked and returned."""
        frames = self.inbox.recv_multipart(copy=False)
        ident, kind = frames[0].bytes, frames[1].bytes
        src = _rank_of(ident)
        if kind == b"H":
            try:
                hello = self._hello(src, frames)
            except Refused as e:
                if not self.serving:
                    raise
                log.warning("refused a connection: %s", e)
                return -1, None
            if self.rank != 0 or not self.serving:  # a served group's rank 0 admits in disco_edge.group
                self.idents[src] = ident
            hello["_ident"] = ident.decode(errors="replace")
            return src, hello
        if src not in self.known or self.idents.get(src) != ident:
            if self.serving:  # a replaced process's last words, or a stranger
                log.info("dropped a message from %r (not the current connection of an authenticated peer)", ident)
                return -1, None
            raise Failed(f"a message from an unauthenticated peer {ident!r} (no hello with this run's token)")
        if kind == b"D":
            tag, seq, released = _TAG.unpack(frames[2].bytes)
            avail = 0.0
            if released > 0:  # an emulated link: the message is usable once this node's downlink carried it
                now = time.perf_counter()
                avail = self.pacing.arrival(released if abs(released - now) < CLOCK_SKEW_S else now,
                                            len(frames[3]))
            self.stash.setdefault((src, tag, seq), deque()).append((frames[3], avail))
        elif kind == b"C":
            msg = json.loads(frames[2].bytes)
            if src == 0 and "abort" in msg:
                self.abort_upto = max(self.abort_upto, int(msg["abort"]))
            self.stash.setdefault((src, "C"), deque()).append(msg)
        elif kind == b"X":
            raise PeerLost(src, f"it stopped: {frames[2].bytes.decode(errors='replace')}")
        elif kind == b"R":
            raise Refused(f"rank {src} refused this node: {frames[2].bytes.decode(errors='replace')}")
        return src, None

    def _hello(self, src: int, frames: list[Any]) -> dict[str, Any]:
        try:
            hello = json.loads(frames[3].bytes)
        except (ValueError, IndexError):
            raise Refused("a malformed hello") from None
        if not isinstance(hello, dict):
            raise Refused("a malformed hello")
        if not 0 <= src < self.nodes or src == self.rank or hello.get("nodes") != self.nodes:
            raise Refused(f"a peer introduced itself as rank {src} of {hello.get('nodes')} nodes; this node is "
                          f"rank {self.rank} of {self.nodes} (a peer list of another length, or another run?)")
        if not hmac.compare_digest(frames[2].bytes, mac(self.token, src)):
            raise Refused(f"rank {src} connected with another run token (a node of another run or export? start "
                          "every node from the same export, with the same DISCO_RUN_TOKEN)")
        self.known.add(src)
        return hello

    def _wait(self, key: tuple[int, Any], timeout: float, seq: int | None = None) -> Any:
        deadline = time.monotonic() + timeout
        box = self.stash.setdefault(key, deque())
        while not box:
            if seq is not None and seq <= self.abort_upto:
                raise Aborted(f"rank 0 abandoned inference {seq}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise PeerLost(key[0], f"no message within {timeout:.0f} s (a stopped or hung peer)")
            if self.inbox.poll(int(min(left, CHECK_S) * 1000) + 1):
                self._pump_one()
                continue
            self._check_gone(key[0])
        msg = box.popleft()
        if not box and len(key) == 3:  # a data message's key (src, tag, seq) is never used again
            del self.stash[key]
        return msg

    def _check_gone(self, src: int) -> None:
        """Note closed connections; raise when ``src``'s closed more than the grace ago (its last messages, sent
        on its own connection, had time to arrive)."""
        for j, mon in self.monitors.items():
            while mon.poll(0):
                if _monitor_event(mon) == zmq.EVENT_DISCONNECTED:
                    self.gone.setdefault(j, time.monotonic())
        if self.parent is not None and os.getppid() != self.parent:
            raise Failed(f"the launcher (pid {self.parent}) is gone; stopping")
        since = self.gone.get(src)
        if since is not None and time.monotonic() - since > GONE_GRACE_S:
            raise PeerLost(src, "its connection closed (the process ended or was killed)")

    def recv(self, src: int, tag: int, nbytes: int, seq: int = 0) -> np.ndarray:
        """The next data message (``src``, ``tag``) of inference ``seq`` as uint8 (zero-copy); its length must be
        ``nbytes``. A message is taken only by the inference whose number it carries, never by another request's
        (the messages of abandoned inferences are dropped by :meth:`purge`)."""
        frame, avail = self._wait((src, tag, seq), self.timeout, seq if self.serving else None)
        if len(frame) != nbytes:
            raise Failed(f"a message from rank {src} (tag {tag}) has {len(frame)} bytes, the schedule says "
                         f"{nbytes} (a peer running another export or codec?)")
        hold = avail - time.perf_counter()
        if hold > 0:  # the emulated downlink has not carried it all yet
            time.sleep(hold)
        return np.frombuffer(frame.buffer, dtype=np.uint8)

    def ready(self, src: int, tag: int, seq: int) -> bool:
        """Whether the data message (``src``, ``tag``) of inference ``seq`` is here (reads what has arrived), and
        on an emulated link, whether this node's downlink has carried it."""
        while self.inbox.poll(0):
            self._pump_one()
        box = self.stash.get((src, tag, seq))
        return bool(box) and box[0][1] <= time.perf_counter()

    def wait_any(self, srcs: set[int], seq: int, deadline: float, cap: float | None = None) -> None:
        """Wait a little for any message (inferences from ``seq`` on wait for ``srcs``); :class:`PeerLost` past
        ``deadline`` (monotonic) or when one of ``srcs`` is gone, :class:`Aborted` once rank 0 abandoned ``seq``.
        ``cap``: wait at most this long (s) even without a message."""
        if self.serving and seq <= self.abort_upto:
            raise Aborted(f"rank 0 abandoned inference {seq}")
        left = deadline - time.monotonic()
        if left <= 0:
            raise PeerLost(min(srcs), f"no message within {self.timeout:.0f} s (a stopped or hung peer)")
        now = time.perf_counter()  # a message here that the emulated downlink still carries: wake when it is in
        held = [box[0][1] - now for k, box in self.stash.items() if len(k) == 3 and box and box[0][1] > now]
        if held:
            left = min(left, *held)
        if cap is not None:
            left = min(left, cap)
        if self.inbox.poll(int(min(left, CHECK_S) * 1000) + 1):
            self._pump_one()
            return
        for src in srcs:
            self._check_gone(src)

    def purge(self, upto: int) -> None:
        """Drop the data messages of inferences up to ``upto`` (abandoned ones)."""
        for key in [k for k in self.stash if len(k) == 3 and k[2] <= upto]:
            del self.stash[key]

    def control(self, src: int, timeout: float | None = None) -> dict[str, Any]:
        """The next control message from ``src``."""
        return self._wait((src, "C"), self.timeout if timeout is None else timeout)

    # ---- sending --------------------------------------------------------------------------------
    def send(self, dst: int, tag: int, buf: np.ndarray, seq: int = 0) -> None:
        """Post ``buf`` (uint8, kept alive until sent) to ``dst`` under ``tag``, as a message of inference
        ``seq``; never blocks on the peer."""
        self.messages += 1
        self._emit(dst, lambda release: [b"D", _TAG.pack(tag, seq, release), buf], len(buf))

    def send_control(self, dst: int, msg: dict[str, Any]) -> None:
        body = json.dumps(msg).encode()
        self._emit(dst, lambda _release: [b"C", body])

    def _emit(self, dst: int, frames_at: Callable[[float], list[Any]], nbytes: int = 0) -> None:
        """Send the frames ``frames_at(release)`` make, ``release`` being the pacer's modelled arrival time on an
        emulated link (0.0: sent at once)."""
        if self._error is not None:
            raise self._error
        if self._q is None:
            frames = frames_at(0.0)
            self.out[dst].send_multipart(frames, copy=len(frames[-1]) < 65536)
        else:
            release = self.pacing.release_time(nbytes)
            self._q.put((release, dst, frames_at(release)))

    def _pace_loop(self) -> None:
        while True:
            item = self._q.get()
            try:
                if item is None:
                    return
                release, dst, frames = item
                delay = release - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                self.out[dst].send_multipart(frames, copy=len(frames[-1]) < 65536)
            except BaseException as e:  # reported by the next send or flush
                self._error = e
            finally:
                self._q.task_done()

    def flush(self) -> None:
        """Wait until every message posted so far has been handed to ZeroMQ."""
        if self._q is not None:
            self._q.join()
        if self._error is not None:
            raise self._error

    def tell_stop(self, why: str) -> None:
        """Best effort: tell every connected peer why this node stops (bypasses the pacer)."""
        for s in self.out.values():
            try:
                s.send_multipart([b"X", why.encode()[:500]], flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def close(self, linger_ms: int = 2000, lost: int | None = None) -> None:
        """Close every socket; messages still queued get ``linger_ms`` to leave, none to ``lost`` or a closed
        connection (they never would: the context's end would wait that long for them)."""
        if self._q is not None:
            self._q.put(None)
        for j, s in self.out.items():
            s.disable_monitor()
            s.close(linger=0 if j == lost or j in self.gone else linger_ms)
        for m in self.monitors.values():
            m.close(linger=0)
        self.inbox.close(linger=0)
        self.ctx.term()


class NoLink:
    """A transport for timing one rank alone: sends are dropped, receives are zeros of the size expected."""

    def send(self, dst: int, tag: int, buf: np.ndarray, seq: int = 0) -> None:
        pass

    def recv(self, src: int, tag: int, nbytes: int, seq: int = 0) -> np.ndarray:
        return np.zeros(nbytes, dtype=np.uint8)

    def flush(self) -> None:
        pass


def _monitor_event(mon: Any) -> int:
    """The event id of one message on a monitor socket: frame 0 is a 16-bit event and a 32-bit value (libzmq's
    monitor API; ``zmq.utils.monitor`` reads it the same way but imports asyncio and ssl, 4 MB per node)."""
    frames = mon.recv_multipart()
    return struct.unpack("=hi", frames[0])[0] if len(frames) == 2 and len(frames[0]) == 6 else -1
