"""Execute one rank's schedule: ONNX Runtime sessions (one compute thread) and the transport's messages.

Values live in an environment dict (name -> numpy array). Steps, in order (ENGINE.md): ``run`` a graph,
``send`` a whole value (``links`` coded with the wire codec, other kinds raw fp32), ``recv`` a value (checked
against the step's shape and byte count before it is decoded), ``free`` values. Each op is a rule in ``STEPS``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .bundle import Bundle
from .codecs import RAW, Codec
from .errors import Failed, Refused
from .procstat import release_free_memory

log = logging.getLogger(__name__)


OPT_LEVELS = ("basic", "extended", "all")
MORE_POLL_S = 0.002  # run_many with ``more``: how long every inference may wait before new jobs are looked for


@functools.cache  # once per process
def _shared_arena(ort: Any) -> None:
    """Register one CPU arena in ONNX Runtime's environment, once per process, for every session to share: a
    rank runs tens of segment graphs, and an arena each held resnet50 N=2 rank 0 at 150 MB peak RSS against
    115 MB shared (with ``enable_mem_pattern`` off and the heap trimmed after each load; same speed)."""
    info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, -1, -1, -1))


def session(path: Any, opt: str = "all") -> Any:
    """An ONNX Runtime CPU session with one compute thread (one thread = one device), allocating from the
    process's one shared arena. ``opt``: the graph optimisation level. With the shared arena "all" costs a
    node little memory and gains speed (resnet50 224 px N=2, the two nodes under SCHED_FIFO: r=0.2 123 MB peak
    RSS and 39 ms at "all" against 122 MB and 47 ms at "basic"; the dense split 139 MB / 66 ms against 134 MB /
    77 ms); for one process of a whole model its layout rewrites hold a second copy of the weights (resnet50:
    314 MB at "all", 176 MB at "basic")."""
    import onnxruntime as ort

    _shared_arena(ort)
    so = ort.SessionOptions()
    so.enable_mem_pattern = False  # a pattern per session is memory held for each of a rank's many graphs
    so.add_session_config_entry("session.use_env_allocators", "1")
    so.graph_optimization_level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                   "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                                   "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[opt]
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    try:
        sess = ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
        release_free_memory()  # the parsed graph's copy of the weights is freed: return it before the next
        return sess
    except Exception as e:  # onnxruntime raises its own Fail / InvalidGraph / NotImplemented types
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise Refused(f"{path}: onnxruntime {ort.__version__} cannot load it ({first}); an opset or op this "
                      "onnxruntime lacks? install a newer onnxruntime") from None


class Counters:
    """Bytes and messages of one inference, split as the torch runtime's transport does."""

    def __init__(self) -> None:
        self.payload_bytes = self.overhead_bytes = self.other_bytes = self.stats_bytes = self.messages = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


class Totals:
    """What a rank did since it started: inferences, compute seconds, bytes and messages sent to each peer."""

    def __init__(self) -> None:
        self.inferences = 0
        self.compute_s = 0.0
        self.bytes_to: dict[int, int] = {}
        self.messages_to: dict[int, int] = {}

    def sent(self, dst: int, nbytes: int) -> None:
        self.bytes_to[dst] = self.bytes_to.get(dst, 0) + nbytes
        self.messages_to[dst] = self.messages_to.get(dst, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {"inferences": self.inferences, "compute_s": round(self.compute_s, 6),
                "bytes_to": {str(k): v for k, v in self.bytes_to.items()},
                "messages_to": {str(k): v for k, v in self.messages_to.items()}}


class Engine:
    """One rank: its sessions, the transport and the wire codec; :meth:`infer` runs the steps once. This is the
    one interpreter of a schedule: the nodes (:class:`disco_edge.transport.ZmqTransport`), the export's proof
    (:class:`disco_edge.local.LocalTransport`) and the planner's timing (``NoLink``) only change the transport."""

    def __init__(self, bundle: Bundle, transport: Any, codec: Codec, opt: str = "all") -> None:
        self.b, self.tr, self.codec = bundle, transport, codec
        self.sessions = {name: session(p, opt) for name, p in bundle.graphs.items()}
        self.io = {name: ([i.name for i in s.get_inputs()], [o.name for o in s.get_outputs()])
                   for name, s in self.sessions.items()}
        self.counters = Counters()
        self.totals = Totals()
        self.received: dict[str, np.ndarray] = {}  # the last input each input message brought (a rank > 0)
        self.local: dict[str, np.ndarray] | None = None  # set: every node has the input, none is sent
        self.seq = 0  # the number of the inference being run
        self._ran = 0  # steps run so far (run_many: whether a resumed inference moved)

    def infer(self, inputs: list[np.ndarray] | None, flush: bool = True, step_s: list[float] | None = None,
              seq: int = 0) -> list[np.ndarray]:
        """Run every step; rank 0 feeds ``inputs`` (the schedule's ``inputs``) and returns its ``outputs``.
        ``flush``: wait until this inference's messages have left (a stream goes on to the next at once);
        ``step_s``: a list that gets each step's seconds (``bench/floor.py``); ``seq``: the inference's number,
        carried by each of its messages (a served request's: a message of another inference is never taken)."""
        self.counters = Counters()
        out: list[np.ndarray] = []
        for _ in self._program(inputs, seq, out, step_s, cooperative=False):
            pass  # a blocking program never yields
        if flush:
            self.tr.flush()
        return out

    def run_many(self, jobs: list[tuple[list[np.ndarray] | None, int]],
                 done: Callable[[int, list[np.ndarray]], None], timeout: float,
                 more: Callable[[int], list[tuple[list[np.ndarray] | None, int]]] | None = None) -> None:
        """Run several inferences ``(inputs, seq)`` at once, interleaved on this one thread: while one waits for
        a message, another computes (a served group's requests in flight). ``done(seq, outputs)`` as each ends
        (rank 0's outputs; [] elsewhere). ``more(running)``: further jobs that join while these run (a served
        group admits requests without waiting for the ones in flight to end), asked each round; the call
        returns once none runs and ``more`` has none. No message for ``timeout`` s while every one waits:
        :class:`PeerLost`."""
        progs: list[tuple[int, list[np.ndarray], Iterator[int]]] = []

        def add(new: list[tuple[list[np.ndarray] | None, int]]) -> None:
            for inputs, seq in new:
                out: list[np.ndarray] = []
                progs.append((seq, out, self._program(inputs, seq, out, None, cooperative=True)))

        add(jobs)
        idle_since = time.monotonic()
        while True:
            if more is not None:
                add(more(len(progs)))
            if not progs:
                return
            waiting, moved = set(), False
            for item in list(progs):
                seq, out, prog = item
                before = self._ran
                try:
                    waiting.add(next(prog))
                except StopIteration:
                    progs.remove(item)
                    done(seq, out)
                moved = moved or self._ran != before
            if moved:
                idle_since = time.monotonic()
            elif progs:  # a new job (``more``) cannot wake the wait: look again soon
                self.tr.wait_any(waiting, min(p[0] for p in progs), idle_since + timeout,
                                 cap=MORE_POLL_S if more is not None else None)

    def _program(self, inputs: list[np.ndarray] | None, seq: int, out: list[np.ndarray],
                 step_s: list[float] | None, cooperative: bool) -> Iterator[int]:
        """The interpreter: the steps of one inference in order. ``cooperative``: before a receive whose message
        has not arrived, yield the sender's rank (the caller runs another inference meanwhile); ``out`` gets rank
        0's outputs at the end."""
        env: dict[str, np.ndarray] = {}
        if inputs is not None:
            for spec, x in zip(self.b.schedule["inputs"], inputs, strict=True):
                env[spec["name"]] = np.ascontiguousarray(x, dtype=np.float32)
        for i, st in enumerate(self.b.schedule["steps"]):
            if cooperative and st["op"] == "recv" and not (self.local is not None and st.get("kind") == "input"):
                while not self.tr.ready(int(st["from"]), int(st["tag"]), seq):
                    yield int(st["from"])
            self.seq = seq  # the steps read it (one thread: whichever inference runs a step sets it first)
            t0 = time.perf_counter()
            try:
                STEPS[st["op"]](self, st, env)
            except KeyError as e:
                raise Failed(f"step {i} ({st['op']}): no value {e} in this rank's environment (a schedule "
                             "that reads a value before it is made)") from None
            self._ran += 1
            dt = time.perf_counter() - t0
            if st["op"] == "run":
                self.totals.compute_s += dt
            if step_s is not None:
                step_s.append(dt)
        self.totals.inferences += 1
        if self.b.rank == 0:
            out.extend(env[o["name"]] for o in self.b.schedule["outputs"])

    def _codec(self, st: dict[str, Any]) -> Codec:
        return self.codec if st.get("kind", "links") == "links" else RAW

    def nbytes(self, st: dict[str, Any]) -> int:
        """The bytes of the message a ``send`` or ``recv`` step carries (its value coded for the wire)."""
        shape = tuple(int(d) for d in st["shape"])
        return self._codec(st).nbytes(shape, _axis(st, len(shape)))


def _axis(st: dict[str, Any], ndim: int) -> int:
    return int(st.get("axis", 1 if ndim > 1 else 0))


def _run(e: Engine, st: dict[str, Any], env: dict[str, np.ndarray]) -> None:
    names_in, names_out = e.io[st["graph"]]
    if set(names_in) <= set(st["inputs"]):  # the graph's inputs carry the env names (disco export); an input the
        feeds = {v: env[v] for v in names_in}  # exporter dropped (only its static shape was read) is not fed
    else:  # else by position
        feeds = dict(zip(names_in, (env[v] for v in st["inputs"]), strict=True))
    outs = e.sessions[st["graph"]].run(names_out, feeds)
    for v, y in zip(st["outputs"], outs, strict=True):
        env[v] = y


def _send(e: Engine, st: dict[str, Any], env: dict[str, np.ndarray]) -> None:
    if e.local is not None and st.get("kind") == "input":
        return  # every node reads the input itself
    x = env[st["value"]]
    axis = _axis(st, x.ndim)
    codec = e._codec(st)
    buf = codec.encode(x, axis)
    c = e.counters
    kind = st.get("kind", "links")
    if kind == "links":
        payload = x.size * codec.bytes_per_value
        c.payload_bytes += payload
        c.overhead_bytes += len(buf) - payload
    elif kind == "stats":
        c.stats_bytes += len(buf)
    else:
        c.other_bytes += len(buf)
    c.messages += 1
    e.totals.sent(int(st["to"]), len(buf))
    e.tr.send(int(st["to"]), int(st["tag"]), buf, seq=e.seq)


def _recv(e: Engine, st: dict[str, Any], env: dict[str, np.ndarray]) -> None:
    if e.local is not None and st.get("kind") == "input":
        env[st["value"]] = e.local[st["value"]]
        return
    shape = tuple(int(s) for s in st["shape"])
    if st.get("dtype", "float32") != "float32":
        raise Failed(f"recv {st['value']!r}: dtype {st['dtype']} (the engine carries float32 values)")
    buf = e.tr.recv(int(st["from"]), int(st["tag"]), e.nbytes(st), seq=e.seq)
    env[st["value"]] = e._codec(st).decode(buf, shape, _axis(st, len(shape)))
    if st.get("kind") == "input":
        e.received[st["value"]] = env[st["value"]]


def _free(e: Engine, st: dict[str, Any], env: dict[str, np.ndarray]) -> None:
    for v in st["values"]:
        env.pop(v, None)


STEPS: dict[str, Callable[[Engine, dict[str, Any], dict[str, np.ndarray]], None]] = {
    "run": _run, "send": _send, "recv": _recv, "free": _free}


def rel_err(out: list[np.ndarray], ref: list[np.ndarray]) -> float:
    """Largest relative error (max |a-b| / max |b|) over the outputs, as ``disco.runtime.export``."""
    worst = 0.0
    for a, b in zip(out, ref, strict=True):
        if a.shape != b.shape:
            return float("inf")
        if b.size:
            den = max(float(np.abs(b).max()), 1e-30)
            worst = max(worst, float(np.abs(a.astype(np.float64) - b).max()) / den)
    return worst
