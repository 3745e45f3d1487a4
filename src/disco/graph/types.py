"""The words of the graph package, below both the op rules (:mod:`disco.graph.ops`) and the partitioner
(:mod:`disco.graph.partition`): what a rule is (:class:`Rule`), what it sees while ownership is inferred
(:class:`Builder`), what it reports (:class:`OpCost`), and the partition it is asked about
(:class:`Partition`, its :class:`MixingLayer` and :class:`Links`).

Rules import from here and register themselves (:mod:`disco.graph.registry`); the partitioner imports
from here and looks rules up; neither imports the other. The partitioner never tests a rule's class:
it asks the rule (``kind``, ``is_mixing``, ``param_nodes``, ``module_of``).

Words: an fx *node* is one op of the captured graph; a *rank* is one node's index (0..N-1) among the
N machines (``nodes``); an *atom* is one channel of one feature tensor before owners are assigned.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
from torch import Tensor, fx, nn

REPLICATED = -1  # owner of a channel that every rank holds (the input image)


def local_index(owner: np.ndarray, rank: int) -> np.ndarray:
    """The channels ``rank`` holds of a tensor with owners ``owner``: its own and the replicated ones."""
    return np.nonzero((owner == rank) | (owner == REPLICATED))[0]


def tensor_args(node: fx.Node, b: Builder) -> list[fx.Node]:
    """The node's arguments that are feature tensors, in order."""
    out: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), lambda a: out.append(a) if b.atoms.get(a) is not None else None)
    return out


def shape_of(node: fx.Node) -> tuple[int, ...] | None:
    """The output shape recorded for ``node``, or None when it is not a tensor."""
    meta = node.meta.get("tensor_meta")
    if meta is None or not hasattr(meta, "shape"):
        return None
    return tuple(meta.shape)


@dataclass
class OpCost:
    """What one op costs for one input: FLOPs per rank and on one device, statistics values exchanged."""

    flops: np.ndarray  # [N] int64
    flops_dense: int
    stats_values: int = 0
    params: np.ndarray | None = None  # [N] weights per rank (mixing layers; others: Rule.shard_tensor)


class Builder(Protocol):
    """What a rule sees while ownership is inferred (:meth:`Rule.infer`): per fx node, its atoms (one per
    channel; ``None`` for values that are not feature tensors) and channel dim, and the updates a rule makes.
    The partitioner's implementation is :class:`disco.graph.builder.OwnershipBuilder`."""

    ranks: int  # N, the number of machines
    atoms: dict[fx.Node, np.ndarray | None]
    cdim: dict[fx.Node, int]
    csplit: dict[fx.Node, tuple[int, ...]]  # channels spread over dims cdim.. with these sizes
    parts: dict[fx.Node, list[tuple[fx.Node, np.ndarray | None]]]  # pieces of chunk/split

    def shape(self, node: fx.Node) -> tuple[int, ...] | None:
        """The recorded output shape of ``node``."""

    def replicated(self, node: fx.Node) -> bool:
        """Does every rank hold all of ``node``'s channels (the input image)?"""

    def replicated_atoms(self, n: int) -> np.ndarray:
        """Atoms of ``n`` channels that every rank holds."""

    def new_atoms(self, n: int) -> np.ndarray:
        """``n`` fresh atoms (a mixing op's output channels: they get owners of their own)."""

    def set(self, node: fx.Node, atoms: np.ndarray, cdim: int) -> None:
        """``node``'s channels are ``atoms``, along dim ``cdim``."""

    def set_static(self, node: fx.Node) -> None:
        """``node`` is not a feature tensor: every rank computes it."""

    def set_view(self, node: fx.Node, segments: list[tuple[fx.Node, np.ndarray]], cdim: int) -> None:
        """``node``'s channels are, in order, channels ``idx`` of each ``(input, idx)`` (no compute)."""

    def set_gather(self, node: fx.Node, src: fx.Node, idx: np.ndarray, cdim: int,
                   split: tuple[int, ...] | None = None, *, rule: Rule) -> None:
        """``node``'s channels are channels ``idx`` of ``src`` (a selection or permutation, no compute), run
        by ``rule`` as an index selection on a rank's local channels. ``split``: the sizes of the dims its
        channels span when they span several (a channel shuffle's intermediate view)."""

    def use_rule(self, node: fx.Node, rule: Rule) -> None:
        """``node`` behaves by ``rule`` (its kind decides how it runs and is costed)."""

    def couple(self, node: fx.Node, a: fx.Node, b: fx.Node) -> None:
        """Operands ``a`` and ``b`` of ``node`` must have the same owner per channel."""

    def couple_atoms(self, xa: np.ndarray, xb: np.ndarray) -> None:
        """Atoms ``xa[k]`` and ``xb[k]`` get the same owner (replicated ones excepted)."""

    def pin(self, node: fx.Node, reader: fx.Node, dim: int) -> None:
        """Replicated tensor ``node`` is read by ``reader`` per channel along ``dim`` (each rank reads its own)."""

    def unsupported(self, node: fx.Node, why: str) -> None:
        """Refuse ``node`` (raises :class:`~disco.errors.UnsupportedOpError` naming it and ``why``)."""


class Rule:
    """Base op kind: a small stateless object registered (:mod:`disco.graph.registry`) for module types,
    functions or method names. Subclasses set ``kind`` and implement :meth:`infer`.

    Kinds (``kind``):

    * ``local``   channel-local compute (BatchNorm, activations, pooling, add, mul, ...): output
      ownership follows input ownership; operands of add/mul are *coupled* (unified).
    * ``reduce``  a channel reduction kept exact by exchanging per-position statistics (LayerNorm).
    * ``view``    no compute and no new link (cat, flatten, identity, dropout): every output channel
      *is* a channel of an input, given as an index map.
    * ``split``   chunk/split: its pieces are gathers from its input.
    * ``mixing``  output channels read many input channels (Conv2d, ConvTranspose2d, Linear):
      :class:`~disco.graph.ops.mixing.Mixing`, which adds the weight layout, the kernel a rank runs
      on its weight blocks, and its weights per rank.
    * ``static``  values that are not feature tensors (``x.size(0)``): computed on every rank.
    """

    kind: ClassVar[str] = "local"
    allocates: ClassVar[bool] = True  # does the op allocate its output (views may not)
    forward_names: ClassVar[tuple[str, ...]] = ("forward",)  # a subclass redefining one is not covered
    reads_split_channels: ClassVar[bool] = False  # may its input have channels over several dims (shuffle)

    @property
    def is_mixing(self) -> bool:
        """Does the op read many input channels through a weight (a mixing layer with links)?"""
        return self.kind == "mixing"

    def param_nodes(self, node: fx.Node) -> list[fx.Node]:
        """Graph nodes that are this op's weight or bias (``get_attr``), not feature tensors."""
        return []

    def module_of(self, node: fx.Node, gm: fx.GraphModule) -> nn.Module | None:
        """What :meth:`infer` gets as ``module``: the called module (``call_module``), else None."""
        return gm.get_submodule(node.target) if node.op == "call_module" else None

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        """Set ``node``'s atoms and channel dim on ``b`` (how channel ownership flows through the op)."""
        raise NotImplementedError

    def flops_per_element(self, in_shape: tuple[int, ...] | None, out_shape: tuple[int, ...]) -> float:
        """FLOPs per output element (local rules): by default input size / output size, at least 1."""
        if in_shape is None:
            return 0.0
        return max(1.0, math.prod(in_shape) / max(1, math.prod(out_shape)))

    def cost(self, part: Partition, node: fx.Node) -> OpCost | None:
        """FLOPs of fx node ``node`` per rank (its elementwise work on the channels a rank holds;
        replicated tensors count on every rank); None for ops without compute (views, static values)."""
        own = part.owner.get(node.name)
        if self.kind in ("view", "static", "mixing") or own is None:
            return None
        n = part.nodes
        shp = shape_of(node)
        per_ch = math.prod(shp) // len(own)
        first = next((a for a in node.all_input_nodes if part.owner.get(a.name) is not None), None)
        fpe = self.flops_per_element(shape_of(first) if first is not None else None, shp)
        counts = np.full(n, len(own)) if (own == REPLICATED).all() else np.bincount(own[own >= 0], minlength=n)
        return OpCost((counts * per_ch * fpe).astype(np.int64), int(math.prod(shp) * fpe))

    def slice_param(self, module: nn.Module, name: str, t: Tensor, local: np.ndarray, channels: int) -> Tensor:
        """A parameter or buffer of this op's module cut to a rank's ``local`` channels (of ``channels``):
        by default one whose first dim equals the channel count is sliced along it."""
        if t.dim() >= 1 and t.shape[0] == channels and len(local) != channels:
            return t[torch.as_tensor(local)]
        return t

    def shard_tensor(self, module: nn.Module, name: str, t: Tensor, owner: np.ndarray | None, rank: int) -> Tensor:
        """What rank ``rank``'s shard holds of ``module``'s tensor ``name`` (output owners ``owner``):
        its slice when the tensor has one entry per channel of a tensor split over the ranks, else all of it."""
        if owner is not None and t.dim() >= 1 and t.shape[0] == len(owner) and (owner != REPLICATED).all():
            return self.slice_param(module, name, t, local_index(owner, rank), len(owner))
        return t


class WeightView:
    """A mixing op's module seen through the names of its weight and bias.

    ``weight`` and ``bias`` read the module's attributes ``param`` and ``bias_name`` (so a
    parametrized, masked weight reads masked); every other attribute (``kernel_size``,
    ``stride``...) is the module's. For a module layer they are ``weight`` and ``bias``; a
    functional op names the parameters it reads (``in_proj_weight`` of MultiheadAttention).
    """

    def __init__(self, module: nn.Module, path: str, param: str = "weight", bias_name: str | None = "bias") -> None:
        self.module, self.path, self.param, self.bias_name = module, path, param, bias_name

    @property
    def weight(self) -> Tensor:
        return getattr(self.module, self.param)

    @property
    def bias(self) -> Tensor | None:
        return getattr(self.module, self.bias_name, None) if self.bias_name else None

    def parameters(self) -> list[nn.Parameter]:
        """The stored parameters behind weight and bias (a parametrization's original)."""
        out = []
        for name in (self.param, self.bias_name):
            if name is None or getattr(self.module, name, None) is None:
                continue
            pz = getattr(self.module, "parametrizations", {})
            out.append(pz[name].original if name in pz else getattr(self.module, name))
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["module"], name)


@dataclass
class MixingLayer:
    """One mixing op: its weight columns, their links and the owner of each output channel."""

    name: str  # module path in the model
    node: str
    rule: Rule  # a mixing op kind (``rule.is_mixing``): :class:`~disco.graph.ops.mixing.Mixing`
    input: str  # the fx node feeding it
    out_owner: np.ndarray  # [O]
    col_link: np.ndarray  # [N, I]: link id, LOCAL (own or replicated) or UNREAD
    macs_per_connection: int
    groups: int = 1
    param: str = "weight"  # the attribute of module ``name`` that holds the weight ...
    bias: str | None = "bias"  # ... and the bias
    in_owner: np.ndarray | None = field(default=None, repr=False)  # [I] owner of each input channel

    LOCAL: int = -1
    UNREAD: int = -2

    @property
    def key(self) -> str:
        """A unique name: the module path, plus the parameter when it is not ``weight``."""
        return self.name if self.param == "weight" else f"{self.name}.{self.param}"

    def view(self, root: nn.Module) -> WeightView:
        """This layer's weight and bias in ``root`` (the model, or its graph module)."""
        return WeightView(root.get_submodule(self.name), self.name, self.param, self.bias)

    def allowed(self, kept: np.ndarray) -> np.ndarray:
        """[N, I] bool: which input channels node j may read, given the kept links."""
        cl = self.col_link
        ok = cl == self.LOCAL
        remote = cl >= 0
        ok[remote] = kept[cl[remote]]
        return ok

    def structure(self) -> np.ndarray:
        """[O, I] bool: the connections the op has at all (block diagonal with groups)."""
        o, i, g = len(self.out_owner), self.col_link.shape[1], self.groups
        return (np.arange(o) // (o // g))[:, None] == (np.arange(i) // (i // g))[None, :]

    def connection_mask(self, kept: np.ndarray) -> np.ndarray:
        """[O, I] bool: where output o may read input i (structure and kept links)."""
        allow = self.allowed(kept)[self.out_owner]
        return allow if self.groups == 1 else allow & self.structure()

    @property
    def depthwise(self) -> bool:
        """One input channel per group, and the input split over the ranks (not the replicated image)."""
        return self.col_link.shape[1] // self.groups == 1 and not (self.in_owner == REPLICATED).all()

    def blocks(self, kept: np.ndarray, rank: int) -> list[WeightBlock]:
        """The weight blocks rank ``rank`` computes with links ``kept``: per group holding some of its output
        rows, those rows x (the local input columns, the received ones). A depthwise layer is one block.
        The one walk over a layer's blocks: the rank plans, the shards and the cost model all use it."""
        rows = np.nonzero(self.out_owner == rank)[0]
        if self.depthwise:  # none on a rank without output channels here (a chunk that another rank owns)
            return [WeightBlock(0, rows, local_index(self.in_owner, rank), np.zeros(0, dtype=np.int64), True)
                    ] if len(rows) else []
        cl = self.col_link[rank]
        allowed = self.allowed(kept)[rank]
        og, ig = len(self.out_owner) // self.groups, self.col_link.shape[1] // self.groups
        out = []
        for k in range(self.groups):
            r = rows[(rows >= k * og) & (rows < (k + 1) * og)]
            if len(r):
                cols = np.arange(k * ig, (k + 1) * ig)
                out.append(WeightBlock(k, r, cols[cl[cols] == self.LOCAL], cols[(cl[cols] >= 0) & allowed[cols]]))
        return out


@dataclass
class WeightBlock:
    """One block of a mixing layer's weight on one rank: output rows x (local columns, received columns),
    all global channel indices within group ``group``."""

    group: int
    rows: np.ndarray
    local: np.ndarray
    received: np.ndarray
    depthwise: bool = False  # rows x their own input channel (``local``), one weight per row

    @property
    def connections(self) -> int:
        """(output, input) pairs the block computes."""
        return len(self.rows) if self.depthwise else len(self.rows) * (len(self.local) + len(self.received))


@dataclass
class Links:
    """All links: parallel arrays over link ids."""

    tensor: np.ndarray  # index into Partition.link_tensors
    receiver: np.ndarray
    channel: np.ndarray
    values: np.ndarray  # values moved per link (channel plane x batch)

    def __len__(self) -> int:
        return len(self.tensor)


@dataclass
class Partition:
    """The result of partitioning a model for N nodes (see DESIGN.md: ownership, links)."""

    nodes: int
    gm: fx.GraphModule
    input_shape: tuple[int, ...]
    owner: dict[str, np.ndarray | None]  # per fx node name: owner per channel (REPLICATED = -1)
    cdim: dict[str, int]
    base: dict[str, tuple[np.ndarray, np.ndarray]]  # per node: (base tensor name idx, base channel)
    base_names: list[str]
    layers: list[MixingLayer]
    links: Links
    link_tensors: list[str]
    rules: dict[str, Rule] = field(repr=False)
    param_nodes: frozenset[str] = frozenset()  # get_attr nodes that are mixing weights (held by the layer)
    gathers: dict[str, tuple[str, np.ndarray]] = field(default_factory=dict)  # node -> (source, channel index)
    relay: bool = False  # exchange placement: see :func:`partition`
    relayed: frozenset[str] = frozenset()  # channel-local ops that receivers apply to the channels they receive
    shares: tuple[float, ...] | None = None  # node j's share of every layer's channels (None: equal)
    shape_guards: tuple[str, ...] = ()  # branches on the input's shape resolved at capture ('file:line -> True')

    def received_masks(self, kept: np.ndarray, rank: int) -> dict[str, np.ndarray]:
        """Per link tensor: [channels] bool, which channels node ``rank`` receives with links ``kept``."""
        L = self.links
        mine = np.asarray(kept, dtype=bool) & (L.receiver == rank)
        out = {}
        for t_idx, t_name in enumerate(self.link_tensors):
            m = np.zeros(len(self.owner[t_name]), dtype=bool)
            m[L.channel[mine & (L.tensor == t_idx)]] = True
            out[t_name] = m
        return out

    def received(self, name: str, masks: dict[str, np.ndarray]) -> np.ndarray:
        """The channels of tensor ``name`` that a node receives (sorted indices), given its
        :meth:`received_masks`: a channel is received when the base channel it is sent as is."""
        bt, bc = self.base[name]
        r = np.zeros(len(bt), dtype=bool)
        for t in np.unique(bt).tolist():
            m = masks.get(self.base_names[t])
            if m is not None:
                sel = bt == t
                r[sel] = m[bc[sel]]
        return np.nonzero(r)[0]

    @property
    def n_links(self) -> int:
        return len(self.links)

    def op(self, name: str) -> Rule:
        """The op kind of fx node ``name`` (a plain :class:`Rule` for values without one)."""
        return self.rules.get(name) or _NO_RULE

    def layer(self, name: str) -> MixingLayer:
        """The mixing layer with module path or :attr:`MixingLayer.key` ``name``."""
        for ly in self.layers:
            if name in (ly.name, ly.key):
                return ly
        raise KeyError(name)

    def fingerprint(self) -> str:
        """A hash of N, the input shape, the graph, the ownership and the links."""
        h = hashlib.sha256()
        h.update(f"{self.nodes}|{self.input_shape}".encode())
        signature = self.gm.meta.get("signature")  # the graph as traced, before sizes were folded (capture)
        if signature is not None:
            for line in signature:
                h.update(line.encode())
        for n in [] if signature is not None else self.gm.graph.nodes:
            target = re.sub(r" at 0x[0-9a-fA-F]+", "", str(n.target))  # e.g. torch.cat: no process address
            h.update(f"{n.op}|{n.name}|{target}|{shape_of(n)}".encode())
        for ly in self.layers:
            h.update(ly.key.encode())
            h.update(ly.out_owner.tobytes())
            h.update(ly.col_link.tobytes())
        for arr in (self.links.tensor, self.links.receiver, self.links.channel, self.links.values):
            h.update(np.ascontiguousarray(arr).tobytes())
        return h.hexdigest()[:32]

    def dense_values(self) -> int:
        return int(self.links.values.sum())

    def kept_values(self, kept: np.ndarray) -> int:
        return int(self.links.values[kept].sum())

    def ratio(self, kept: np.ndarray) -> float:
        total = self.dense_values()
        return self.kept_values(kept) / total if total else 0.0

    def all_links(self) -> np.ndarray:
        return np.ones(self.n_links, dtype=bool)

    def no_links(self) -> np.ndarray:
        return np.zeros(self.n_links, dtype=bool)


_NO_RULE = Rule()
