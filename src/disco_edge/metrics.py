"""Prometheus metrics of a served group (``GET /metrics``): names with the ``disco_`` prefix, base units.

Request metrics are counted by the HTTP front as requests end; the state of each node (joined, restarts, bytes
and messages sent to each peer, compute seconds, RSS) is read from the group at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _Nodes(Collector):
    """The nodes' figures, from ``nodes()`` (rank -> the state dict of :meth:`disco_edge.group.Group.nodes`)."""

    def __init__(self, nodes: Callable[[], dict[int, dict[str, Any]]]) -> None:
        self.nodes = nodes

    def collect(self) -> Iterator[Any]:
        up = GaugeMetricFamily("disco_node_up", "1 while the rank is joined to the group", labels=["rank"])
        restarts = CounterMetricFamily("disco_node_restarts", "times the rank rejoined the group", labels=["rank"])
        rss = GaugeMetricFamily("disco_node_resident_memory_bytes", "the rank's resident set size (last report)",
                                labels=["rank"])
        comp = CounterMetricFamily("disco_node_compute_seconds", "seconds the rank spent in ONNX Runtime",
                                   labels=["rank"])
        infs = CounterMetricFamily("disco_node_inferences", "inferences the rank ran", labels=["rank"])
        sent = CounterMetricFamily("disco_sent_bytes", "message bytes sent, by sender and receiver",
                                   labels=["rank", "peer"])
        msgs = CounterMetricFamily("disco_sent_messages", "messages sent, by sender and receiver",
                                   labels=["rank", "peer"])
        for r, n in sorted(self.nodes().items()):
            rank = str(r)
            up.add_metric([rank], 1.0 if n.get("joined") else 0.0)
            restarts.add_metric([rank], float(n.get("restarts", 0)))
            if n.get("rss_mb") is not None:
                rss.add_metric([rank], float(n["rss_mb"]) * 1e6)
            t = n.get("totals") or {}
            comp.add_metric([rank], float(t.get("compute_s", 0.0)))
            infs.add_metric([rank], float(t.get("inferences", 0)))
            for peer, v in (t.get("bytes_to") or {}).items():
                sent.add_metric([rank, str(peer)], float(v))
            for peer, v in (t.get("messages_to") or {}).items():
                msgs.add_metric([rank, str(peer)], float(v))
        yield from (up, restarts, rss, comp, infs, sent, msgs)


class Metrics:
    """The registry of one served group."""

    def __init__(self, nodes: Callable[[], dict[int, dict[str, Any]]], queue_depth: Callable[[], int],
                 ready: Callable[[], bool]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("disco_requests", "inference requests by outcome (success, failure: the group "
                                "failed it, rejected: refused before the queue, bad_request, unauthorized)",
                                ["outcome"], registry=r)
        self.duration = Histogram("disco_request_duration_seconds", "seconds from arrival to answer of an "
                                  "inference request", buckets=BUCKETS, registry=r)
        self.queue_wait = Histogram("disco_queue_wait_seconds", "seconds an inference request waited in the queue",
                                    buckets=BUCKETS, registry=r)
        Gauge("disco_queue_depth", "requests waiting in the queue", registry=r).set_function(queue_depth)
        Gauge("disco_ready", "1 while the group is ready to serve", registry=r).set_function(
            lambda: 1.0 if ready() else 0.0)
        r.register(_Nodes(nodes))

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
