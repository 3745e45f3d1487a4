"""The schedule as data: each rank's ordered steps, derived once from (partition, kept links).

The torch executor executes it (:mod:`disco.runtime.executor`), the cost model sums it
(:func:`disco.cost.estimate`), the planner prices it (:func:`disco.planner.programs`), and the
ONNX export serialises it per rank (``schedule.json``, see ``ENGINE.md``). A rank's steps are:

* ``Run(node, half)``: compute fx node ``node`` on the rank's channels. ``half`` is ``"all"`` for
  an ordinary op; a mixing op is ``"local"`` (its weight blocks over the rank's own input channels,
  run while the remote channels are in flight) then, when the rank reads received channels,
  ``"remote"`` (the blocks over the received channels, added); a channel reduction split across
  ranks (LayerNorm) is ``"partial"`` (per-position statistics of the rank's channels), the stats
  messages, then ``"finish"``. The leader ends with ``"gather"`` per output: its own channels and the
  received ones in channel order.
* ``Message(op="send"|"recv", kind, value, peer, tag, shape, axis, channels, links)``: one
  point-to-point message. ``kind`` is ``"links"`` (the kept channel planes of a base tensor from its
  owner to a receiver, sent right after the tensor is computed, awaited just before the first mixing
  op reading them), ``"stats"``, ``"input"`` (the leader sends the input to every rank) or
  ``"output"`` (every rank sends its channels of the outputs to the leader). ``channels`` are the
  global channel indices along ``axis``, in message order; ``links`` the link ids it carries.

Message tags are defined here only. This module imports no torch itself (the partition it reads
holds the fx graph).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .graph.types import REPLICATED, shape_of

if TYPE_CHECKING:
    from .graph import Partition

FORMAT = "disco-schedule/1"
TAG_INPUT, TAG_OUTPUT, TAG_LINKS, TAG_STATS = 1, 2, 16, 1 << 20  # links: + tensor index; stats: + reduction index
KINDS = ("links", "stats", "input", "output")
HALVES = ("all", "local", "remote", "partial", "finish", "gather")


@dataclass(frozen=True)
class Run:
    """Compute fx node ``node`` (or one half of it) on this rank."""

    node: str
    half: str = "all"

    def to_json(self) -> dict[str, Any]:
        return {"op": "run", "node": self.node, "half": self.half}


@dataclass(frozen=True)
class Message:
    """One message sent to or received from ``peer`` (see the module docstring)."""

    op: str  # "send" | "recv"
    kind: str  # one of KINDS
    value: str  # the fx node whose tensor travels (the reduction node for stats)
    peer: int
    tag: int
    shape: tuple[int, ...]  # the message's shape (float32 values before the wire codec)
    axis: int  # the channel dim (the int8 codec's per-channel scales run along it)
    channels: tuple[int, ...] = ()  # global channel indices along ``axis`` (links, output)
    links: tuple[int, ...] = ()  # link ids (links)

    @property
    def values(self) -> int:
        """Number of values in the message."""
        return math.prod(self.shape)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"op": self.op, "kind": self.kind, "value": self.value,
                             ("to" if self.op == "send" else "from"): self.peer, "tag": self.tag,
                             "shape": list(self.shape), "dtype": "float32", "axis": self.axis}
        if self.channels:
            d["channels"] = list(self.channels)
        if self.links:
            d["links"] = list(self.links)
        return d


Step = Run | Message


@dataclass(frozen=True)
class Port:
    """An input or output of the whole model (fx node name, global shape)."""

    name: str
    shape: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": "float32"}


@dataclass
class RankSchedule:
    """Rank ``rank``'s ordered steps for one inference."""

    rank: int
    nodes: int
    inputs: list[Port]
    outputs: list[Port]
    steps: list[Step] = field(default_factory=list)

    def messages(self, op: str | None = None, kind: str | None = None) -> Iterator[Message]:
        """The messages of this rank, in order, optionally of one ``op`` and ``kind``."""
        for s in self.steps:
            if isinstance(s, Message) and (op is None or s.op == op) and (kind is None or s.kind == kind):
                yield s

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "rank": self.rank, "nodes": self.nodes,
                "inputs": [p.to_json() for p in self.inputs], "outputs": [p.to_json() for p in self.outputs],
                "steps": [s.to_json() for s in self.steps]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RankSchedule:
        """Read :meth:`to_json`'s form back (a wrong format is a ValueError)."""
        if d.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} schedule: format {d.get('format')!r}")
        ports = [[Port(p["name"], tuple(p["shape"])) for p in d[k]] for k in ("inputs", "outputs")]
        return cls(int(d["rank"]), int(d["nodes"]), ports[0], ports[1], [_step(s) for s in d["steps"]])


def _step(s: dict[str, Any]) -> Step:
    if s["op"] == "run":
        if s.get("half", "all") not in HALVES:
            raise ValueError(f"unknown run half {s.get('half')!r}")
        return Run(s["node"], s.get("half", "all"))
    if s["op"] not in ("send", "recv") or s["kind"] not in KINDS:
        raise ValueError(f"unknown step {s['op']!r} of kind {s.get('kind')!r}")
    peer = s["to"] if s["op"] == "send" else s["from"]
    return Message(s["op"], s["kind"], s["value"], int(peer), int(s["tag"]), tuple(s["shape"]), int(s["axis"]),
                   tuple(s.get("channels", ())), tuple(s.get("links", ())))


def env_key(m: Message, rank: int) -> str:
    """The name of a message's value in rank ``rank``'s environment: the input itself, the reduction's
    statistics ``node@stats`` (sent to every peer), else ``value@kind:src>dst`` (a link message is the cut
    of its tensor to the channels it carries)."""
    if m.kind == "input":
        return m.value
    if m.kind == "stats" and m.op == "send":
        return f"{m.value}@stats"
    src, dst = (rank, m.peer) if m.op == "send" else (m.peer, rank)
    return f"{m.value}@{m.kind}:{src}>{dst}"


def cuts(steps: list[Step]) -> dict[int, list[Message]]:
    """The link and output sends whose message is cut from its tensor at the end of the compute before them:
    index of the last run before each block of messages (-1: none) -> that block's sends to cut."""
    out: dict[int, list[Message]] = {}
    last = -1
    for i, st in enumerate(steps):
        if isinstance(st, Run):
            last = i
        elif st.op == "send" and st.kind in ("links", "output"):
            out.setdefault(last, []).append(st)
    return out


def link_senders(part: Partition) -> np.ndarray:
    """[n_links]: the rank that owns (and sends) each link's channel."""
    lk = part.links
    out = np.zeros(len(lk), dtype=np.int64)
    for t, name in enumerate(part.link_tensors):
        sel = lk.tensor == t
        out[sel] = part.owner[name][lk.channel[sel]]
    return out


def _with(shape: tuple[int, ...], dim: int, n: int) -> tuple[int, ...]:
    s = list(shape)
    s[dim] = n
    return tuple(s)


class _Builder:
    """One walk over the graph appending every rank's steps."""

    def __init__(self, part: Partition, kept: np.ndarray) -> None:
        self.part, self.kept, self.n = part, kept, part.nodes
        self.by_name = {nd.name: nd for nd in part.gm.graph.nodes}
        self.steps: list[list[Step]] = [[] for _ in range(self.n)]
        L, senders = part.links, link_senders(part)
        self.links: dict[str, dict[tuple[int, int], np.ndarray]] = {}  # tensor -> (src, dst) -> link ids
        for t, name in enumerate(part.link_tensors):
            ids = np.nonzero(kept & (L.tensor == t))[0]
            for s in range(self.n):
                for r in range(self.n):
                    sel = ids[(senders[ids] == s) & (L.receiver[ids] == r)]
                    if len(sel):
                        self.links.setdefault(name, {})[(s, r)] = sel[np.argsort(L.channel[sel], kind="stable")]
        self.waited: list[set[str]] = [set() for _ in range(self.n)]
        self.layer_of = {ly.node: ly for ly in part.layers}

    def link_message(self, op: str, name: str, src: int, dst: int) -> Message:
        ids = self.links[name][(src, dst)]
        part = self.part
        cdim = part.cdim[name]
        return Message(op, "links", name, dst if op == "send" else src, TAG_LINKS + part.link_tensors.index(name),
                       _with(shape_of(self.by_name[name]), cdim, len(ids)), cdim,
                       tuple(part.links.channel[ids].tolist()), tuple(ids.tolist()))

    def inputs(self, names: list[str]) -> None:
        for name in names:
            shape = shape_of(self.by_name[name])
            axis = self.part.cdim.get(name, 1)
            for j in range(1, self.n):
                self.steps[0].append(Message("send", "input", name, j, TAG_INPUT, shape, axis))
                self.steps[j].append(Message("recv", "input", name, 0, TAG_INPUT, shape, axis))

    def mixing(self, name: str) -> None:
        ly = self.layer_of[name]
        bt, _ = self.part.base[ly.input]
        needs = sorted({self.part.base_names[t] for t in np.unique(bt).tolist()} & set(self.links),
                       key=self.part.link_tensors.index)
        for j in range(self.n):
            self.steps[j].append(Run(name, "local"))
            if not any(len(b.received) for b in ly.blocks(self.kept, j)):
                continue
            for t in needs:
                if t in self.waited[j]:
                    continue
                self.waited[j].add(t)
                self.steps[j] += [self.link_message("recv", t, s, j) for s in range(self.n) if (s, j) in self.links[t]]
            self.steps[j].append(Run(name, "remote"))

    def reduce(self, name: str, k: int) -> None:
        nd, part = self.by_name[name], self.part
        cdim, rule = part.cdim[name], part.rules[name]
        shape = shape_of(nd)
        stats = rule.stats_shape(shape, cdim)  # what the rule's partial() computes
        for j in range(self.n):
            others = [i for i in range(self.n) if i != j]
            self.steps[j].append(Run(name, "partial"))
            self.steps[j] += [Message("send", "stats", name, i, TAG_STATS + k, stats, len(stats) - 1) for i in others]
            self.steps[j] += [Message("recv", "stats", name, i, TAG_STATS + k, stats, len(stats) - 1) for i in others]
            self.steps[j].append(Run(name, "finish"))

    def sends(self, name: str) -> None:
        for (s, r) in sorted(self.links.get(name, {})):
            self.steps[s].append(self.link_message("send", name, s, r))

    def leftovers(self) -> None:
        """Receives no remote half waited for (none with a consistent partition): awaited before the outputs."""
        for j in range(self.n):
            for t, pairs in self.links.items():
                if t not in self.waited[j]:
                    self.steps[j] += [self.link_message("recv", t, s, j) for s in range(self.n) if (s, j) in pairs]

    def outputs(self, names: list[str]) -> None:
        for name in names:
            own, cdim = self.part.owner[name], self.part.cdim[name]
            if (own == REPLICATED).all():
                continue
            for j in range(1, self.n):
                ch = np.nonzero(own == j)[0]
                if not len(ch):
                    continue
                shape = _with(shape_of(self.by_name[name]), cdim, len(ch))
                chans = tuple(ch.tolist())
                self.steps[j].append(Message("send", "output", name, 0, TAG_OUTPUT, shape, cdim, chans))
                self.steps[0].append(Message("recv", "output", name, j, TAG_OUTPUT, shape, cdim, chans))
        self.steps[0] += [Run(name, "gather") for name in names]


def build(part: Partition, kept: np.ndarray | None = None) -> list[RankSchedule]:
    """Every rank's schedule for ``part`` with links ``kept`` (None: every link)."""
    kept = part.all_links() if kept is None else np.asarray(kept, dtype=bool)
    b = _Builder(part, kept)
    nodes = list(part.gm.graph.nodes)
    ins = [nd.name for nd in nodes if nd.op == "placeholder" and shape_of(nd) is not None]
    out_node = next(nd for nd in nodes if nd.op == "output")
    outs = [a.name for a in out_node.all_input_nodes if part.owner.get(a.name) is not None]
    b.inputs(ins)
    n_reduce = 0
    for nd in nodes:
        rule = part.rules.get(nd.name)
        if nd.op in ("placeholder", "output"):
            pass
        elif nd.name in b.layer_of:
            b.mixing(nd.name)
        elif rule is not None and rule.kind == "reduce":
            if part.owner.get(nd.name) is not None and not (part.owner[nd.name] == REPLICATED).all():
                b.reduce(nd.name, n_reduce)
            else:
                for st in b.steps:
                    st.append(Run(nd.name))
            n_reduce += 1
        else:
            for st in b.steps:
                st.append(Run(nd.name))
        b.sends(nd.name)
    b.leftovers()
    b.outputs(outs)
    shapes = {nd.name: shape_of(nd) for nd in nodes}
    return [RankSchedule(j, part.nodes, [Port(x, shapes[x]) for x in ins], [Port(x, shapes[x]) for x in outs],
                         b.steps[j]) for j in range(part.nodes)]
