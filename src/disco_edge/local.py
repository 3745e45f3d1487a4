"""The engine's in-process transport: the N ranks of an export as N threads of one process, messages in queues.

The proof of an ONNX export (``disco.edge.simulate``) runs here, so that it executes the schedules with the very
interpreter that the nodes run (:class:`disco_edge.engine.Engine`), only the transport differs. A deadlock (every
rank that has not finished waits for a message nobody will send) is detected at once, not by a timeout.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from .errors import Failed

log = logging.getLogger(__name__)


class Hub:
    """The queues of one in-process group: ``(src, dst, tag)`` -> messages, and who waits for which."""

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes
        self.cond = threading.Condition()
        self.boxes: dict[tuple[int, int, int], deque] = {}
        self.waiting: dict[int, tuple[int, int, int]] = {}
        self.done: set[int] = set()
        self.error: BaseException | None = None

    def fail(self, e: BaseException) -> None:
        """Stop every rank (the first error wins)."""
        with self.cond:
            if self.error is None:
                self.error = e
            self.cond.notify_all()

    def finish(self, rank: int) -> None:
        with self.cond:
            self.done.add(rank)
            self._check_deadlock()
            self.cond.notify_all()

    def _check_deadlock(self) -> None:
        if self.error is None and self.waiting and len(self.waiting) + len(self.done) == self.nodes \
                and not any(self.boxes.get(k) for k in self.waiting.values()):
            stuck = {r: f"from rank {k[0]}, tag {k[2]}" for r, k in sorted(self.waiting.items())}
            self.error = Failed(f"the schedules deadlock: ranks wait for {stuck}")


class LocalTransport:
    """One rank's end of a :class:`Hub` (the interface of :class:`disco_edge.transport.ZmqTransport` that the
    engine uses: ``send``, ``recv``, ``flush``)."""

    def __init__(self, hub: Hub, rank: int, timeout: float = 600.0) -> None:
        self.hub, self.rank, self.timeout = hub, rank, timeout

    def send(self, dst: int, tag: int, buf: np.ndarray, seq: int = 0) -> None:
        with self.hub.cond:
            self.hub.boxes.setdefault((self.rank, dst, tag), deque()).append(np.array(buf, copy=True))
            self.hub.cond.notify_all()

    def recv(self, src: int, tag: int, nbytes: int, seq: int = 0) -> np.ndarray:
        key = (src, self.rank, tag)
        h = self.hub
        with h.cond:
            box = h.boxes.setdefault(key, deque())
            h.waiting[self.rank] = key
            try:
                while not box:
                    h._check_deadlock()
                    if h.error is not None:
                        raise h.error
                    if not h.cond.wait(self.timeout):
                        raise Failed(f"rank {self.rank}: no message from rank {src} (tag {tag}) within "
                                     f"{self.timeout:.0f} s")
            finally:
                h.waiting.pop(self.rank, None)
            buf = box.popleft()
        if len(buf) != nbytes:
            raise Failed(f"a message from rank {src} (tag {tag}) has {len(buf)} bytes, the schedule says {nbytes}")
        return buf

    def flush(self) -> None:
        pass


def run_group(folder: str | Path, inputs: dict[str, np.ndarray], codec: str = "fp32", opt: str = "all",
              verify: bool = False) -> tuple[list[np.ndarray], list[Any]]:
    """Run every rank of the ONNX export ``folder`` once, one thread each, on ``inputs`` (rank 0's, by name):
    rank 0's outputs (in its schedule's order) and each rank's :class:`disco_edge.engine.Engine`."""
    from . import bundle
    from .codecs import get_codec
    from .engine import Engine

    folder = Path(folder)
    nodes = len(list(folder.glob("rank*/schedule.json")))
    hub = Hub(nodes)
    engines = [Engine(bundle.load(folder, r, nodes, verify=verify), LocalTransport(hub, r), get_codec(codec), opt)
               for r in range(nodes)]
    try:
        x = [inputs[spec["name"]] for spec in engines[0].b.schedule["inputs"]]
    except KeyError as e:
        raise Failed(f"no input {e} for rank 0 (given: {', '.join(inputs)})") from None
    outs: list[np.ndarray] = []

    def body(r: int) -> None:
        try:
            got = engines[r].infer(x if r == 0 else None)
            if r == 0:
                outs.extend(got)
            hub.finish(r)
        except BaseException as e:  # every rank stops; the first error is raised below
            hub.fail(e)

    threads = [threading.Thread(target=body, args=(r,), name=f"disco-rank{r}", daemon=True) for r in range(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if hub.error is not None:
        raise hub.error
    return outs, engines
