"""Transport: wire codecs, payload byte counters, link pacing, and point-to-point message passing.

Link model (the same one the latency model in ``bench/`` uses): every node has one network
interface limited to ``bandwidth`` bits/s, full duplex (sending and receiving do not compete),
and all nodes sit behind one non-blocking switch. A message of S bytes occupies the sender's
uplink for S*8/bandwidth seconds (messages leave one after the other), then arrives after the
one-way ``latency``; the receiver's downlink is also serialized (S*8/bandwidth per message).
Pacing emulates this on an unshaped link (loopback): a sender thread releases each message
at its modelled arrival time, and the receiver holds it until its downlink would be free.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from disco_edge.link import LinkModel, Pacing  # the one link model of both engines (torch-free)

from ..errors import PeerError

log = logging.getLogger(__name__)


# ---- codecs ---------------------------------------------------------------------------------

class Codec:
    """How a float32 tensor of channel planes travels on the wire (as raw bytes)."""

    name = "fp32"
    bytes_per_value = 4

    def nbytes(self, shape: tuple[int, ...], cdim: int) -> int:
        """Total bytes of the message for a tensor of ``shape``."""
        return int(np.prod(shape)) * self.bytes_per_value

    def overhead(self, shape: tuple[int, ...], cdim: int) -> int:
        return self.nbytes(shape, cdim) - int(np.prod(shape)) * self.bytes_per_value

    def encode(self, t: Tensor, cdim: int) -> Tensor:
        return t.detach().to(torch.float32).contiguous().reshape(-1).view(torch.uint8)

    def decode(self, buf: Tensor, shape: tuple[int, ...], cdim: int) -> Tensor:
        return buf.view(torch.float32).reshape(shape)


class CastCodec(Codec):
    def __init__(self, name: str, dtype: torch.dtype) -> None:
        self.name, self.dtype = name, dtype
        self.bytes_per_value = torch.tensor([], dtype=dtype).element_size()

    def encode(self, t: Tensor, cdim: int) -> Tensor:
        return t.detach().to(self.dtype).contiguous().reshape(-1).view(torch.uint8)

    def decode(self, buf: Tensor, shape: tuple[int, ...], cdim: int) -> Tensor:
        return buf.view(self.dtype).reshape(shape).to(torch.float32)


class Int8Codec(Codec):
    """int8 values with one float32 scale per channel (max-abs / 127), the scales after the values."""

    name = "int8"
    bytes_per_value = 1

    def nbytes(self, shape: tuple[int, ...], cdim: int) -> int:
        return int(np.prod(shape)) + 4 * shape[cdim]

    def encode(self, t: Tensor, cdim: int) -> Tensor:
        t = t.detach().to(torch.float32)
        dims = [d for d in range(t.dim()) if d != cdim]
        amax = t.abs().amax(dim=dims, keepdim=True) if dims else t.abs()
        scale = (amax / 127.0).clamp_min(1e-30)
        q = torch.round(t / scale).clamp_(-127, 127).to(torch.int8)
        return torch.cat([q.contiguous().reshape(-1).view(torch.uint8),
                          scale.reshape(-1).contiguous().view(torch.uint8)])

    def decode(self, buf: Tensor, shape: tuple[int, ...], cdim: int) -> Tensor:
        n = int(np.prod(shape))
        q = buf[:n].view(torch.int8).reshape(shape).to(torch.float32)
        sshape = [1] * len(shape)
        sshape[cdim] = shape[cdim]
        scale = buf[n:].clone().view(torch.float32).reshape(sshape)
        return q * scale


CODECS: dict[str, Codec] = {
    "fp32": Codec(), "fp16": CastCodec("fp16", torch.float16), "bf16": CastCodec("bf16", torch.bfloat16),
    "int8": Int8Codec(),
}


def get_codec(name: str) -> Codec:
    try:
        return CODECS[name]
    except KeyError:
        raise ValueError(f"unknown codec {name!r}; choose one of {', '.join(CODECS)}") from None


# ---- link model -------------------------------------------------------------------------------

def parse_bandwidth(s: str | None) -> float | None:
    """'100mbit' -> 1e8 bits/s; None -> None (unshaped). The rules live in :mod:`disco.validate`."""
    from ..validate import parse_bandwidth as parse

    return parse(s)


def parse_latency(s: str | None) -> float:
    """'2ms' -> 0.002 seconds (a unit is required). The rules live in :mod:`disco.validate`."""
    from ..validate import parse_latency as parse

    return parse(s)




# ---- transports -------------------------------------------------------------------------------

IO_THREAD_PREFIX = "gloo"  # gloo names its event-loop threads gloo_tcp_loop


def lower_io_threads(nice: int) -> list[int]:
    """Give this process's gloo I/O threads at least the niceness ``nice`` (Linux; elsewhere nothing); returns
    their ids.

    gloo's event loop polls a connection's socket while the main thread holds that connection's lock (it tries
    the lock, fails, and polls again), so at equal priority it takes a core away from the node's compute and,
    on a host with fewer cores than threads, from the peer's; a node then stalls in ``isend`` for a scheduler
    slice. At a high niceness the loop still runs whenever a core is free (while the node waits for a message),
    which is when it is needed. Raising one's own threads' niceness needs no privilege; a thread already
    nicer keeps its niceness (lowering it would need privilege)."""
    if nice <= 0 or not os.path.isdir("/proc/self/task"):
        return []
    done = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            if name.startswith(IO_THREAD_PREFIX):
                os.setpriority(os.PRIO_PROCESS, int(tid), max(nice, os.getpriority(os.PRIO_PROCESS, int(tid))))
                done.append(int(tid))
        except OSError as e:  # the thread ended, or the system refused: the run works either way
            log.debug("cannot lower thread %s: %s", tid, e)
    log.debug("gloo I/O threads %s at niceness %d", done, nice)
    return done


def gloo_reason(e: BaseException) -> str:
    """gloo's error in a few words: its first line without the source location and the advice."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = re.sub(r"^\[[^\]]*\]\s*", "", text).split(". This is typically")[0]
    return f"{type(e).__name__}: {text}"[:200]


class _Handle:
    def __init__(self, tr: BaseTransport, src: int, shape: tuple[int, ...], cdim: int, codec: Codec,
                 waiter: Callable[[], Tensor], nbytes: int) -> None:
        self.tr, self.src, self.shape, self.cdim, self.codec, self.waiter, self.nbytes = \
            tr, src, shape, cdim, codec, waiter, nbytes
        self._val: Tensor | None = None

    def wait(self) -> Tensor:
        if self._val is None:
            try:
                buf = self.waiter()
            except PeerError:
                raise
            except Exception as e:  # gloo raises RuntimeError with its own text
                raise PeerError(self.src, gloo_reason(e)) from e
            self.tr._downlink(self.nbytes)
            self._val = self.codec.decode(buf, self.shape, self.cdim)
        return self._val


class BaseTransport:
    """Codecs, byte counters and pacing; subclasses move raw uint8 buffers."""

    def __init__(self, rank: int, nodes: int, codec: str | Codec = "fp32", link: LinkModel | None = None,
                 n_links: int = 0, values_per_link: np.ndarray | None = None, cdims: dict[int, int] | None = None
                 ) -> None:
        self.rank, self.nodes = rank, nodes
        self.codec = codec if isinstance(codec, Codec) else get_codec(codec)
        self.raw = Codec()
        self.link = link or LinkModel()
        self.cdims = cdims or {}
        self.link_bytes = np.zeros(n_links, dtype=np.int64)  # payload bytes sent per link id
        self.values_per_link = values_per_link
        self.payload_bytes = 0  # link payload (what the cost model counts)
        self.overhead_bytes = 0  # codec side data (int8 scales)
        self.other_bytes = 0  # input distribution and output gather
        self.stats_bytes = 0  # channel-reduction statistics (LayerNorm all-reduce)
        self.messages = 0
        self.pacing = Pacing(self.link)  # the uplink and downlink clocks (shared with disco_edge)
        self._q: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        if self.link.shaped:
            self._q = queue.Queue()
            self._thread = threading.Thread(target=self._pace_loop, name="disco-pacer", daemon=True)
            self._thread.start()

    # subclass API
    def _post_send(self, buf: Tensor, dst: int, tag: int) -> Any:
        raise NotImplementedError

    def _post_recv(self, nbytes: int, src: int, tag: int) -> Callable[[], Tensor]:
        raise NotImplementedError

    def _wait_sends(self) -> None:
        pass

    def mark(self) -> int:
        """A position in this node's sends, for :meth:`settle` (transports that keep no send state: 0)."""
        return 0

    def settle(self, upto: int) -> None:
        """Complete the sends before ``mark`` ``upto`` and drop their buffers (no-op here)."""

    # pacing
    def _pace_loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                self._q.task_done()
                return
            release, buf, dst, tag = item
            try:
                delay = release - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                self._post_send(buf, dst, tag)
            except BaseException as e:  # reported by flush()
                self._error = e
            finally:
                self._q.task_done()

    def _downlink(self, nbytes: int) -> None:
        self.pacing.downlink(nbytes)

    # public API
    def send(self, tag: int, dst: int, t: Tensor, links: np.ndarray | None = None, coded: bool = True,
             stats: bool = False) -> None:
        """Send ``t`` to ``dst`` (non-blocking). ``links``: the link ids it carries (for the counters);
        ``stats``: channel-reduction statistics (LayerNorm), counted apart, sent uncoded."""
        cdim = self.cdims.get(tag, 1 if t.dim() > 1 else 0)
        codec = self.codec if coded else self.raw
        buf = codec.encode(t, cdim)
        n = buf.numel()
        if coded:
            payload = t.numel() * codec.bytes_per_value
            self.payload_bytes += payload
            self.overhead_bytes += n - payload
            if links is not None and self.values_per_link is not None:
                self.link_bytes[links] += self.values_per_link[links] * codec.bytes_per_value
        elif stats:
            self.stats_bytes += n
        else:
            self.other_bytes += n
        self.messages += 1
        if self._q is not None:
            self._q.put((self.pacing.release_time(n), buf, dst, tag))
        else:
            self._post_send(buf, dst, tag)

    def recv(self, tag: int, src: int, shape: tuple[int, ...], coded: bool = True) -> _Handle:
        """Post a receive of a tensor of ``shape`` from ``src``; ``.wait()`` returns it (float32)."""
        cdim = self.cdims.get(tag, 1 if len(shape) > 1 else 0)
        codec = self.codec if coded else self.raw
        n = codec.nbytes(shape, cdim)
        return _Handle(self, src, shape, cdim, codec, self._post_recv(n, src, tag), n)

    def flush(self) -> None:
        """Wait until every message sent so far has left."""
        if self._q is not None:
            self._q.join()
        if self._error is not None:
            raise self._error
        self._wait_sends()

    def close(self) -> None:
        if self._q is not None and self._thread is not None and self._thread.is_alive():
            self._q.put(None)
            self._thread.join(timeout=5)

    def reset_counters(self) -> None:
        """Zero the byte and message counters (e.g. between a dataset pass and the timed runs)."""
        self.link_bytes[:] = 0
        self.payload_bytes = self.overhead_bytes = self.other_bytes = self.stats_bytes = self.messages = 0

    def counters(self) -> dict[str, Any]:
        return {"payload_bytes": int(self.payload_bytes), "overhead_bytes": int(self.overhead_bytes),
                "other_bytes": int(self.other_bytes), "stats_bytes": int(self.stats_bytes),
                "messages": self.messages}


class LocalHub:
    """Mailboxes for N nodes running as threads of one process (tests, quick checks)."""

    def __init__(self) -> None:
        self.boxes: dict[tuple[int, int, int], queue.Queue] = {}
        self.lock = threading.Lock()

    def box(self, src: int, dst: int, tag: int) -> queue.Queue:
        with self.lock:
            return self.boxes.setdefault((src, dst, tag), queue.Queue())


class ThreadTransport(BaseTransport):
    """Transport between threads of one process (same codecs, counters and pacing)."""

    def __init__(self, hub: LocalHub, rank: int, nodes: int, timeout: float = 30.0, **kw: Any) -> None:
        self.hub, self.timeout = hub, timeout
        super().__init__(rank, nodes, **kw)

    def _post_send(self, buf: Tensor, dst: int, tag: int) -> None:
        self.hub.box(self.rank, dst, tag).put(buf.clone())

    def _post_recv(self, nbytes: int, src: int, tag: int) -> Callable[[], Tensor]:
        box = self.hub.box(src, self.rank, tag)

        def wait() -> Tensor:
            try:
                buf = box.get(timeout=self.timeout)
            except queue.Empty:
                raise PeerError(src, f"no message within {self.timeout:.0f} s") from None
            if buf.numel() != nbytes:
                raise RuntimeError(f"message from rank {src} has {buf.numel()} bytes, expected {nbytes}")
            return buf

        return wait


class DistTransport(BaseTransport):
    """torch.distributed point-to-point (gloo on CPU): one message per (tensor, src, dst)."""

    def __init__(self, rank: int, nodes: int, **kw: Any) -> None:
        self._works: list[Any] = []
        self._settled = 0  # sends completed and dropped so far
        self._lock = threading.Lock()
        super().__init__(rank, nodes, **kw)

    def _post_send(self, buf: Tensor, dst: int, tag: int) -> None:
        import torch.distributed as dist

        w = dist.isend(buf, dst, tag=tag)
        with self._lock:
            self._works.append((w, dst, buf))

    @staticmethod
    def _check(works: list[Any]) -> None:
        for w, dst, _ in works:
            try:
                w.wait()
            except Exception as e:
                raise PeerError(dst, gloo_reason(e)) from e

    def mark(self) -> int:
        """How many sends were posted so far (for :meth:`settle`)."""
        with self._lock:
            return self._settled + len(self._works)

    def settle(self, upto: int) -> None:
        """Complete the first ``upto`` posted sends and drop their buffers. A stream that never flushes calls
        this once an inference's output is back (its sends were all received), so memory stays bounded
        (gloo marks a send complete only when it is waited for)."""
        with self._lock:
            k = max(0, min(len(self._works), upto - self._settled))
            done, self._works = self._works[:k], self._works[k:]
            self._settled += k
        self._check(done)

    def _post_recv(self, nbytes: int, src: int, tag: int) -> Callable[[], Tensor]:
        import torch.distributed as dist

        buf = torch.empty(nbytes, dtype=torch.uint8)
        w = dist.irecv(buf, src, tag=tag)

        def wait() -> Tensor:
            w.wait()
            return buf

        return wait

    def _wait_sends(self) -> None:
        with self._lock:
            works, self._works = self._works, []
            self._settled += len(works)
        self._check(works)
