"""Link emulation, the model of ``disco.runtime.transport`` (and the same option syntax as ``disco.validate``).

Every node has one interface of ``bandwidth`` bits/s, full duplex, behind one switch: a message of S bytes
occupies the sender's uplink for S*8/bandwidth seconds (messages leave one after the other) and arrives after the
one-way ``latency``; the receiver's downlink is serialised the same way. On an unshaped link (loopback) a pacer
thread releases each message at its modelled arrival time and the receiver holds it until its downlink is free.
The node engine's messages carry their release time (:meth:`Pacing.arrival`), so the downlink is modelled when the
message arrives, not when the engine reads it: a node busy with another request does not delay the messages that
came meanwhile (the emulation runs every node on one host, whose monotonic clock they share).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from .errors import Refused

BANDWIDTH_RE = re.compile(r"^([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmgt]?)(?:bit|bits|bit/s|bps)$", re.I)
LATENCY_RE = re.compile(r"^([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(us|µs|ms|s)$", re.I)
UNSHAPED = ("none", "inf", "unshaped")


def parse_bandwidth(s: str | None) -> float | None:
    """``'100mbit'`` -> 1e8 bits/s; None / 'none' / 'inf': unshaped."""
    if s is None or str(s).strip().lower() in UNSHAPED:
        return None
    m = BANDWIDTH_RE.match(str(s).strip())
    if not m or float(m.group(1)) <= 0:
        raise Refused(f"cannot parse bandwidth {s!r}; write e.g. 10mbit, 100mbit, 1gbit")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2).lower()]


def parse_latency(s: str | None) -> float:
    """``'2ms'`` -> 0.002 s; None: no added latency."""
    if s is None:
        return 0.0
    m = LATENCY_RE.match(str(s).strip())
    if not m:
        raise Refused(f"cannot parse latency {s!r}; write e.g. 2ms, 500us, 0.01s")
    return float(m.group(1)) * {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2).lower()]


@dataclass
class LinkModel:
    """Per-node interface of ``bandwidth_bps`` (None: unshaped), full duplex, one switch, one-way latency."""

    bandwidth_bps: float | None = None
    latency_s: float = 0.0

    @property
    def shaped(self) -> bool:
        return self.bandwidth_bps is not None or self.latency_s > 0

    def wire_time(self, nbytes: int) -> float:
        return 0.0 if self.bandwidth_bps is None else nbytes * 8.0 / self.bandwidth_bps


class Pacing:
    """The uplink and downlink clocks of one node."""

    def __init__(self, link: LinkModel) -> None:
        self.link = link
        self._tx_free = 0.0
        self._rx_free = 0.0

    def release_time(self, nbytes: int) -> float:
        """When a message of ``nbytes`` posted now arrives at its receiver (uplink serialised + latency)."""
        start = max(time.perf_counter(), self._tx_free)
        self._tx_free = start + self.link.wire_time(nbytes)
        return self._tx_free + self.link.latency_s

    def arrival(self, released: float, nbytes: int) -> float:
        """When a message that its sender's pacer released at ``released`` (its modelled uplink end + latency, on
        this host's ``perf_counter`` clock) is fully received, its ``nbytes`` serialised on this node's downlink
        after the messages that came before it. Call in arrival order."""
        if self.link.bandwidth_bps is None:
            return released
        self._rx_free = max(released, self._rx_free + self.link.wire_time(nbytes))
        return self._rx_free

    def downlink(self, nbytes: int) -> None:
        """Hold a received message until this node's downlink would have carried it."""
        if self.link.bandwidth_bps is None:
            return
        now = time.perf_counter()
        avail = max(now, self._rx_free + self.link.wire_time(nbytes))
        self._rx_free = avail
        if avail > now:
            time.sleep(avail - now)
