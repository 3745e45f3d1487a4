"""Rank 0 of a served group: the group's lifecycle and the request queue, on the one thread that owns the sockets.

States: ``joining`` (waiting for ranks) -> ``self-test`` (the shipped reference through the whole group) ->
``ready``. A lost member (its connection closed, it stopped answering within ``--timeout``, or it reported a
failure) makes the group ``not ready``: the inferences in flight and the queued requests fail at once with the
reason, the other members abandon the inferences they run (``abort``), and rank 0 waits for the rank to rejoin
(same rank, same export, same run token), then runs the self-test again. Requests from the HTTP front (another
thread, which never touches a socket) enter a bounded queue; up to ``inflight`` of them flow through the
schedule at once (each rank starts the next as soon as it is done with its part of the previous; every message
carries its inference's number, and each answer goes to the request whose number it has).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import Failed, PeerLost, WrongAnswer
from .procstat import peak_rss_mb, rss_mb, trim_heap

log = logging.getLogger(__name__)
PARENT_ENV = "DISCO_LAUNCHER_PID"  # as disco_edge.node: set by disco serve's supervisor
IDLE_POLL_S = 0.05  # rank 0 looks at its connections this often while no request waits
STATS_EVERY_S = 1.0  # a follower reports its figures at most this often
ADMIT_S = 1.0  # rank 0 admits arriving requests into the running ones for this long, then reads its members


class Unavailable(Exception):
    """The request cannot be taken now (``status``: 503; ``why``: said to the client)."""

    def __init__(self, why: str, status: int = 503) -> None:
        super().__init__(why)
        self.status = status


@dataclass
class Request:
    """One inference request: rank 0's inputs, its id, its deadline (monotonic s) and where its answer goes."""

    inputs: list[np.ndarray]
    id: str
    deadline: float
    done: Callable[[list[np.ndarray] | None, str | None, int], None]  # (outputs, error, status): called once
    enqueued: float = field(default_factory=time.monotonic)
    started: float = 0.0
    cancelled: bool = False
    seq: int = -1


class Group:
    """Rank 0's group thread: membership, self-test, request queue. ``node``: a :class:`disco_edge.node.Node`
    (loaded, not started)."""

    def __init__(self, node: Any, max_queue: int = 64, inflight: int = 4) -> None:
        self.node, self.nodes = node, node.a.nodes
        self.q: queue.Queue[Request] = queue.Queue(max_queue)
        self.max_queue, self.inflight = max_queue, inflight
        self.state = "starting"
        self.why = "the group is starting"
        self.members: dict[int, dict[str, Any]] = {
            j: {"rank": j, "joined": j == 0, "ever_joined": j == 0, "restarts": 0, "pid": None, "rss_mb": None,
                "peak_rss_mb": None, "self_test_err": None, "error": None, "totals": {}, "stash_keys": None}
            for j in range(self.nodes)}  # every key from the start: the front copies these dicts from its thread
        self.seq = 0
        self.self_tests = 0
        self.ready_since: float | None = None
        self.on_wait: Callable[[float], None] = lambda s: None  # the front's queue-wait histogram
        self._stop = threading.Event()
        self.fatal: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="disco-group", daemon=True)

    # ---- the HTTP front's side (another thread: no socket, no engine) --------------------------------------
    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def submit(self, req: Request) -> None:
        """Queue ``req``; :class:`Unavailable` at once when the group is not ready or the queue is full."""
        if not self.ready:
            raise Unavailable(f"the group is not ready: {self.why}")
        try:
            self.q.put_nowait(req)
        except queue.Full:
            raise Unavailable(f"the queue is full ({self.max_queue} requests wait); retry later") from None

    def nodes_state(self) -> dict[int, dict[str, Any]]:
        """Each rank's state (joined, restarts, RSS, self-test error, its figures), rank 0's refreshed."""
        me = self.members[0]
        if getattr(self.node, "engine", None) is not None:
            me["totals"] = self.node.engine.totals.as_dict()
        me["rss_mb"], me["peak_rss_mb"], me["pid"] = round(rss_mb(), 2), round(peak_rss_mb(), 2), os.getpid()
        tr = getattr(self.node, "tr", None)
        me["stash_keys"] = None if tr is None else len(tr.stash)  # messages' queues held (bounded, not per request)
        return {j: dict(m) for j, m in self.members.items()}

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """End the group: the members are told (``end``), the sockets closed."""
        self._stop.set()
        self.thread.join(timeout)

    # ---- the group thread ------------------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._start()
            while not self._stop.is_set():
                self._step()
        except BaseException as e:  # a failure of rank 0 itself ends the service
            log.error("the group stops: %s", e)
            self.fatal = e
            self.state, self.why = "failed", f"rank 0 failed: {e}"
            self._fail_queued(f"rank 0 failed: {e}")
        finally:
            self._close()

    def _start(self) -> None:
        from .engine import Engine
        from .membership import GroupTransport

        n, a = self.node, self.node.a
        n.tr = GroupTransport(0, a.nodes, n.b.token(), n.link, timeout=a.timeout)
        parent = os.environ.get(PARENT_ENV, "")
        n.tr.parent = int(parent) if parent.isdigit() else None
        n.engine = Engine(n.b, n.tr, n.codec, a.graph_opt)
        n.tr.listen(a.leader)
        self.state, self.why = "joining", f"waiting for ranks {self._missing()} to join"
        log.info("rank 0 listens at %s for %d ranks", a.leader, a.nodes - 1)

    def _missing(self) -> list[int]:
        return [j for j, m in self.members.items() if not m["joined"]]

    def _step(self) -> None:
        trim_heap()
        if self.ready:
            try:
                first = self.q.get(timeout=IDLE_POLL_S)
            except queue.Empty:
                first = None
            self._housekeeping(0.0)
            if first is not None:
                batch = [first]
                while len(batch) < self.inflight:
                    try:
                        batch.append(self.q.get_nowait())
                    except queue.Empty:
                        break
                self._serve(batch)
            return
        self._housekeeping(IDLE_POLL_S)
        if not self._missing() and self.state != "failed":
            self._self_test()

    def _housekeeping(self, wait_s: float) -> None:
        """Read hellos and reports, notice lost members."""
        tr = self.node.tr
        if tr.parent is not None and os.getppid() != tr.parent:
            raise Failed(f"the supervisor (pid {tr.parent}) is gone; stopping")
        try:
            hellos = tr.poll(wait_s)
        except PeerLost as e:  # a member said it stops
            self._lost(e.peer, str(e))
            return
        except Failed as e:
            self._broken(str(e))
            return
        for j, hello in hellos:
            self._join(j, hello)
        for j in self.members:
            box = tr.stash.get((j, "C"))
            while box:
                self._report(j, box.popleft())
        for j in sorted(tr.lost()):
            if self.members[j]["joined"]:
                self._lost(j, "its connection closed (the process ended or was killed)")

    def _report(self, j: int, msg: dict[str, Any]) -> None:
        m = self.members[j]
        if "stats" in msg:
            m["rss_mb"], m["totals"] = msg["stats"].get("rss_mb"), msg["stats"].get("totals", {})
            m["pid"], m["peak_rss_mb"] = msg["stats"].get("pid"), msg["stats"].get("peak_rss_mb")
            m["stash_keys"] = msg["stats"].get("stash_keys")
        if "failed" in msg:
            self._broken(f"rank {j}: {msg['failed']}")

    def _join(self, j: int, hello: dict[str, Any]) -> None:
        tr, m = self.node.tr, self.members[j]
        addr = hello.get("addr")
        if not addr:
            log.warning("rank %d said hello without its address (not a --leader start?): ignored", j)
            return
        if m["joined"] and tr.connected(j):
            log.warning("refused a second process for rank %d (at %s): rank %d is live in the group", j, addr, j)
            tr.refuse(addr, f"rank {j} is live in this group (identity is the rank; stop it first)")
            return
        if m["joined"]:
            self._lost(j, "its process was replaced", forget=False)
        if m.get("ever_joined"):
            m["restarts"] += 1
        m.update(joined=True, error=None, ever_joined=True)
        tr.idents[j] = hello["_ident"].encode()
        tr.admit(j, addr, {k for k, mm in self.members.items() if mm["joined"]})
        log.info("rank %d joined from %s", j, addr)
        missing = self._missing()
        if missing:
            self.state, self.why = "joining", f"waiting for ranks {missing} to join"

    def _lost(self, j: int, why: str, forget: bool = True) -> None:
        tr, m = self.node.tr, self.members[j]
        log.warning("lost rank %d: %s", j, why)
        m.update(joined=False, error=why, rss_mb=None)
        if forget:
            tr.drop(j, f"rank 0 dropped rank {j} from the group: {why}")
        else:
            tr.close_out(j)
        self._not_ready(f"rank {j} is missing ({why})")

    def _broken(self, why: str) -> None:
        log.warning("the group failed an inference: %s", why)
        self._not_ready(why)

    def _not_ready(self, why: str) -> None:
        """Fail what is queued, tell the members to abandon every inference started so far."""
        self.state, self.why, self.ready_since = "not ready", why, None
        self._fail_queued(f"the group is not ready: {why}")
        tr = self.node.tr
        tr.purge(self.seq)
        for k, mm in self.members.items():
            if k and mm["joined"]:
                tr.send_control(k, {"abort": self.seq})

    def _fail_queued(self, why: str) -> None:
        while True:
            try:
                self.q.get_nowait().done(None, why, 503)
            except queue.Empty:
                return

    def _go(self, seq: int, rid: str, lossless: bool = False) -> None:
        for j in range(1, self.nodes):
            self.node.tr.send_control(j, {"go": True, "seq": seq, "id": rid, **({"lossless": True} if lossless
                                                                                 else {})})

    def _self_test(self) -> None:
        """The shipped reference through the whole group; rank 0 refuses to serve a wrong answer."""
        n = self.node
        self.state, self.why = "self-test", "running the self-test"
        self.seq += 1
        self._go(self.seq, "self-test", lossless=True)
        try:
            with n.lossless():
                out = n.engine.infer(n.ref[0], seq=self.seq)
            err = n.check(out, "self-test")
        except PeerLost as e:
            self._lost(e.peer, str(e))
            return
        except WrongAnswer as e:  # never serve it
            if not self.self_tests:
                raise  # the first self-test: the node refuses to start (exit 3), as a benchmark's node does
            self.state, self.why = "failed", str(e)
            self.members[0]["self_test_err"] = str(e)
            self._fail_queued(str(e))
            log.error("%s", e)
            return
        except Failed as e:
            self._broken(str(e))
            return
        self.self_tests += 1
        self.members[0]["self_test_err"] = err
        self.state, self.why, self.ready_since = "ready", "", time.monotonic()
        log.info("self-test passed (rel. err %.2e): ready", err)

    def _serve(self, batch: list[Request]) -> None:
        """Run ``batch`` and, for up to ``ADMIT_S``, the requests that arrive meanwhile (at most ``inflight`` at
        once); then the group looks at its members again (``_housekeeping``) before the next."""
        n, t_start = self.node, time.monotonic()
        by_seq: dict[int, Request] = {}

        def start(reqs: list[Request]) -> list[tuple[list[np.ndarray], int]]:
            now, jobs = time.monotonic(), []
            for r in reqs:
                if r.cancelled:
                    continue
                if now > r.deadline:
                    r.done(None, "the request's deadline passed while it waited in the queue", 504)
                    continue
                self.seq += 1
                r.seq, r.started = self.seq, now
                self.on_wait(now - r.enqueued)
                self._go(r.seq, r.id)
                by_seq[r.seq] = r
                jobs.append((r.inputs, r.seq))
            return jobs

        def more(running: int) -> list[tuple[list[np.ndarray], int]]:
            if time.monotonic() - t_start > ADMIT_S or self._stop.is_set():
                return []
            reqs = []
            while running + len(reqs) < self.inflight:
                try:
                    reqs.append(self.q.get_nowait())
                except queue.Empty:
                    break
            return start(reqs)

        def finished(seq: int, out: list[np.ndarray]) -> None:
            by_seq.pop(seq).done(out, None, 200)

        try:  # the requests interleaved on this thread: one computes while another waits for a message
            n.engine.run_many(start(batch), finished, n.a.timeout, more)
            n.tr.flush()
        except PeerLost as e:
            for r in by_seq.values():
                r.done(None, f"the group lost rank {e.peer} during the inference: {e}", 503)
            self._lost(e.peer, str(e))
        except Failed as e:
            for r in by_seq.values():
                r.done(None, f"the inference failed: {e}", 503)
            self._broken(str(e))

    def _close(self) -> None:
        tr = getattr(self.node, "tr", None)
        if tr is None:
            return
        for j, m in self.members.items():
            if j and m["joined"]:
                try:
                    tr.send_control(j, {"end": True})
                except Exception:  # best effort: the sockets close next
                    pass
        try:
            tr.flush()
        except Exception:
            pass
        tr.close(500)
