"""Who is in a served group: the transport of a group that stays up while a non-leader leaves and rejoins.

Rank 0 listens at the leader's address for as long as the group serves. A rank says hello (run token, its own
address); rank 0 admits it when its rank is free (never joined, or its process gone), sends it the peer table
and tells every other member the new address; a hello for a rank whose process is still connected is refused
(``R`` frame: identity is the rank). Every member reconnects to a peer whose address changed. All of this runs
on the one thread that owns the sockets (rank 0's group thread, a follower's main thread).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import zmq

from .transport import GONE_GRACE_S, ZmqTransport, _monitor_event, mac

log = logging.getLogger(__name__)


class GroupTransport(ZmqTransport):
    """:class:`ZmqTransport` plus membership changes (a served group; ``serving`` set)."""

    def listen(self, leader: str) -> None:
        """Rank 0: bind the rendezvous address; ranks join through :meth:`poll` and :meth:`admit`."""
        self.serving = True
        self.addrs = [self.bind(leader)] + [""] * (self.nodes - 1)

    def poll(self, timeout_s: float) -> list[tuple[int, dict[str, Any]]]:
        """Read what arrives within ``timeout_s`` (at least one wait): the hellos (rank, hello) received."""
        hellos = []
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if not self.inbox.poll(max(0, int(left * 1000))):
                break
            src, hello = self._pump_one()
            if hello is not None:
                hellos.append((src, hello))
            if left <= 0:
                break
        return hellos

    def lost(self) -> set[int]:
        """Members whose connection closed more than the grace ago."""
        for j, mon in self.monitors.items():
            while mon.poll(0):
                if _monitor_event(mon) == zmq.EVENT_DISCONNECTED:
                    self.gone.setdefault(j, time.monotonic())
        now = time.monotonic()
        return {j for j, t in self.gone.items() if now - t > GONE_GRACE_S}

    def connected(self, j: int) -> bool:
        """Whether ``j`` has a connection that has not closed."""
        self.lost()
        return j in self.out and j not in self.gone

    def close_out(self, j: int, linger_ms: int = 0) -> None:
        """Close the connection to ``j`` (its process is gone, or moved); what it sent stays readable."""
        self.flush()  # the pacer is idle before its sockets change
        s = self.out.pop(j, None)
        if s is not None:
            s.disable_monitor()
            s.close(linger=linger_ms)
        mon = self.monitors.pop(j, None)
        if mon is not None:
            mon.close(linger=0)
        self.gone.pop(j, None)

    def drop(self, j: int, why: str | None = None) -> None:
        """Forget ``j``: its connection, its proof and the messages it left (its process is gone). ``why``: its
        process may still run (it stopped answering): it is told to stop, so that it is started again and rejoins."""
        if why is not None and j in self.out and j not in self.gone:
            try:
                self.out[j].send_multipart([b"X", why.encode()[:500]], flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        self.close_out(j, 500 if why is not None else 0)
        self.known.discard(j)
        self.idents.pop(j, None)
        for key in [k for k in self.stash if k[0] == j]:
            del self.stash[key]

    def admit(self, j: int, addr: str, members: set[int]) -> None:
        """Rank 0: connect to ``j`` (whose hello just verified) at ``addr``, send it the table, and the new table
        to the other ``members``."""
        self.close_out(j)
        self.addrs[j] = addr
        self._connect(j, addr, {"rank": 0, "nodes": self.nodes})
        self.send_control(j, {"peers": self.addrs, "serve": True})
        for k in members - {0, j}:
            self.send_control(k, {"peers": self.addrs})

    def refuse(self, addr: str, why: str) -> None:
        """Rank 0: tell the process at ``addr`` (a second claimant of a live rank) that it is refused."""
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.ROUTING_ID, b"r0:" + self.nonce.encode())
        s.connect(addr)
        s.send_multipart([b"H", mac(self.token, 0), json.dumps({"rank": 0, "nodes": self.nodes}).encode()])
        s.send_multipart([b"R", why.encode()[:500]])
        s.close(linger=1000)

    def update_peers(self, addrs: list[str]) -> None:
        """A follower: connect to every peer whose address is new or changed (the old connection dropped)."""
        for j, addr in enumerate(addrs):
            if j in (0, self.rank) or not addr or (j < len(self.addrs) and self.addrs[j] == addr and j in self.out):
                continue
            if j in self.out:
                log.info("rank %d moved to %s: reconnecting", j, addr)
                self.close_out(j)
            self._connect(j, addr, {"rank": self.rank, "nodes": self.nodes})
        self.addrs = list(addrs)
