"""Partitioning: ownership of every feature tensor and the links between nodes.

Ownership is solved as data, not per architecture: every channel of every feature
tensor is an *atom*; mixing ops create fresh atoms, channel-local ops pass atoms
through, add/mul (and PixelShuffle groups) *unify* atoms in a union-find, and views
(cat, flatten) build index maps. Each group of unified atoms is then given one owner,
by a balanced contiguous split of the mixing op that created it.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import fx, nn

from .capture import capture, shape_of
from .errors import UnsupportedOpError, describe, unsupported
from .ops.base import REPLICATED, Rule, local_index, tensor_args
from .ops.mixing import Mixing, WeightView
from .ops.views import GATHER
from .registry import rule_for, uncovered_base

log = logging.getLogger(__name__)


class _UnionFind:
    def __init__(self) -> None:
        self.parent = np.zeros(0, dtype=np.int64)

    def grow(self, n: int) -> np.ndarray:
        start = len(self.parent)
        self.parent = np.concatenate([self.parent, np.arange(start, start + n)])
        return np.arange(start, start + n)

    def find(self, a: np.ndarray) -> np.ndarray:
        a = np.asarray(a, dtype=np.int64).copy()
        while True:
            p = self.parent[a]
            if np.array_equal(p, a):
                return a
            self.parent[a] = self.parent[p]  # path halving
            a = p

    def union(self, a: np.ndarray, b: np.ndarray) -> None:
        for x, y in zip(a.tolist(), b.tolist(), strict=True):
            rx, ry = self.find(np.array([x]))[0], self.find(np.array([y]))[0]
            if rx != ry:
                self.parent[max(rx, ry)] = min(rx, ry)


class Builder:
    """What rules see while ownership is inferred: atoms, channel dims and shapes per fx node."""

    def __init__(self, gm: fx.GraphModule, ranks: int) -> None:
        self.gm = gm
        self.ranks = ranks  # N, the number of machines
        self.uf = _UnionFind()
        self.blocks: list[np.ndarray] = []  # atoms created by each mixing op, in creation order
        self.atoms: dict[fx.Node, np.ndarray | None] = {}
        self.cdim: dict[fx.Node, int] = {}
        self.sources: dict[fx.Node, list[tuple[fx.Node, np.ndarray]]] = {}
        self.rule_of: dict[fx.Node, Rule] = {}  # a rule may hand a node to another rule (cat over tokens)
        self.csplit: dict[fx.Node, tuple[int, ...]] = {}  # channels spread over dims cdim.. with these sizes
        self.gathers: dict[fx.Node, tuple[fx.Node, np.ndarray]] = {}  # channel selections/permutations
        self.parts: dict[fx.Node, list[tuple[fx.Node, np.ndarray | None]]] = {}  # pieces of chunk/split

    # queries
    def shape(self, node: fx.Node) -> tuple[int, ...] | None:
        return shape_of(node)

    def replicated(self, node: fx.Node) -> bool:
        a = self.atoms[node]
        return a is not None and bool((a == REPLICATED).all())

    # updates
    def replicated_atoms(self, n: int) -> np.ndarray:
        """Atoms of ``n`` channels that every node holds."""
        return np.full(n, REPLICATED, dtype=np.int64)

    def new_atoms(self, n: int) -> np.ndarray:
        a = self.uf.grow(n)
        self.blocks.append(a)
        return a

    def set(self, node: fx.Node, atoms: np.ndarray, cdim: int) -> None:
        self.atoms[node], self.cdim[node] = np.asarray(atoms, dtype=np.int64), cdim

    def set_static(self, node: fx.Node) -> None:
        self.atoms[node] = None

    def set_view(self, node: fx.Node, segments: list[tuple[fx.Node, np.ndarray]], cdim: int) -> None:
        self.sources[node] = segments
        self.set(node, np.concatenate([self.atoms[a][idx] for a, idx in segments]), cdim)

    def set_gather(self, node: fx.Node, src: fx.Node, idx: np.ndarray, cdim: int,
                   split: tuple[int, ...] | None = None) -> None:
        """``node``'s channels are channels ``idx`` of ``src`` (a selection or permutation, no compute): a
        node runs it as an index selection on its local channels. ``split``: the sizes of the dims its
        channels span when they span several (a channel shuffle's intermediate view)."""
        self.set_view(node, [(src, np.asarray(idx, dtype=np.int64))], cdim)
        self.gathers[node] = (src, np.asarray(idx, dtype=np.int64))
        if split is not None and len(split) > 1:
            self.csplit[node] = tuple(split)
        self.use_rule(node, GATHER)

    def use_rule(self, node: fx.Node, rule: Rule) -> None:
        """Record that ``node`` behaves by ``rule`` (its kind decides how it runs and is costed)."""
        self.rule_of[node] = rule

    def couple(self, node: fx.Node, a: fx.Node, b: fx.Node) -> None:
        """Operands ``a`` and ``b`` of ``node`` must have the same owner per channel."""
        xa, xb = self.atoms[a], self.atoms[b]
        if len(xa) != len(xb):
            self.unsupported(node, f"combines {len(xa)} with {len(xb)} channels")
        self.couple_atoms(xa, xb)

    def couple_atoms(self, xa: np.ndarray, xb: np.ndarray) -> None:
        both = (xa != REPLICATED) & (xb != REPLICATED)
        self.uf.union(xa[both], xb[both])

    def unsupported(self, node: fx.Node, why: str) -> None:
        raise unsupported(node, self.gm, why)


def share_sizes(n: int, nodes: int, shares: tuple[float, ...] | None = None) -> list[int]:
    """How many of n channels each node gets: proportional to ``shares`` (largest remainder, ties to
    the lower rank, every node at least one channel when n >= nodes); equal shares: the first
    n % nodes get one more."""
    w = np.ones(nodes) if shares is None else np.asarray(shares, dtype=np.float64)
    exact = n * w / w.sum()
    sizes = np.floor(exact + 1e-9).astype(np.int64)
    order = sorted(range(nodes), key=lambda k: (-(exact[k] - sizes[k]), k))
    for k in order[:n - int(sizes.sum())]:
        sizes[k] += 1
    if n >= nodes:  # no node without channels: take one from the largest
        for k in range(nodes):
            if sizes[k] == 0:
                sizes[int(np.argmax(sizes))] -= 1
                sizes[k] = 1
    return sizes.tolist()


def split_owner(n: int, nodes: int, shares: tuple[float, ...] | None = None) -> np.ndarray:
    """Contiguous split of n channels over ``nodes``, balanced or in proportion to ``shares``."""
    return np.repeat(np.arange(nodes), share_sizes(n, nodes, shares))


def check_shares(shares: tuple[float, ...] | list[float] | None, nodes: int) -> tuple[float, ...] | None:
    """``shares`` as a tuple (None when absent or all equal); refuses a wrong length or a share <= 0."""
    if shares is None:
        return None
    shares = tuple(float(s) for s in shares)
    if len(shares) != nodes:
        raise ValueError(f"shares {','.join(f'{s:g}' for s in shares)} has {len(shares)} entries, N is {nodes}")
    if not all(math.isfinite(s) and s > 0 for s in shares):
        raise ValueError(f"shares must be positive numbers, got {','.join(f'{s:g}' for s in shares)}")
    return None if len(set(shares)) == 1 else shares


@dataclass
class MixingLayer:
    """One mixing op: its weight columns, their links and the owner of each output channel."""

    name: str  # module path in the model
    node: str
    rule: Mixing
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
        if self.depthwise:
            return [WeightBlock(0, rows, local_index(self.in_owner, rank), np.zeros(0, dtype=np.int64), True)]
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
    shares: tuple[float, ...] | None = None  # node j's share of every layer's channels (None: equal)

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
        for n in self.gm.graph.nodes:
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


def partition(model: nn.Module, example: torch.Tensor | tuple[int, ...], nodes: int,
              shares: tuple[float, ...] | list[float] | None = None, relay: bool = True) -> Partition:
    """Trace ``model`` on ``example`` (a tensor or an input shape) and partition it over ``nodes``.

    ``shares`` (one positive number per node, e.g. ``(2, 1)``): node j owns a part of every
    layer's channels in proportion to its share (default: equal parts).

    ``relay`` (exchange placement): a channel that reaches a mixing op through channel-local ops
    (BatchNorm, activations, padding, upsampling) applied after a view (concatenation, channel
    shuffle) or that enlarge its plane is sent *before* those ops, and the receiver applies them
    itself (its shard holds their per-channel parameters for the channels it receives): a
    DenseNet channel crosses once instead of once per later layer, an upsampled one at its small
    size. ``False`` sends every channel where the last op before the mixing op produced it
    (checkpoints and exports record which placement they were made with).

    Raises :class:`UnsupportedOpError` naming the op and its module path when an op
    has no rule.
    """
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    shares = check_shares(shares, nodes)
    if not isinstance(example, torch.Tensor):
        example = torch.zeros(tuple(example))
    gm = capture(model, example)
    b = Builder(gm, nodes)
    rules: dict[str, Rule] = {}
    param_nodes = set()  # weights that mixing ops read from the graph (F.linear on in_proj_weight)
    for node in gm.graph.nodes:
        rule = rule_for(node, gm) if node.op.startswith("call_") else None
        if isinstance(rule, Mixing):
            param_nodes.update(a.name for a in rule.param_nodes(node))
    for node in gm.graph.nodes:
        shp = shape_of(node)
        if node.op in ("placeholder", "get_attr"):
            if shp is None or node.name in param_nodes:
                b.set_static(node)
            else:  # replicated: channels along dim 1 (images), the last dim for B x T x D tokens
                cd = len(shp) - 1 if (len(shp) == 3 or len(shp) < 2) else 1
                b.set(node, np.full(shp[cd], REPLICATED), cd)
            continue
        if node.op == "output":
            continue
        rule = rule_for(node, gm)
        if rule is None and shp is None and not tensor_args(node, b):
            b.set_static(node)  # arithmetic on sizes and flags: computed on every node
            continue
        if rule is None and node.op == "call_module":
            base = uncovered_base(type(gm.get_submodule(node.target)))
            if base is not None:
                raise UnsupportedOpError(
                    f"{describe(node, gm)} is a subclass of {base.__name__} that redefines its forward, which the "
                    f"rule for {base.__name__} does not describe; register a rule for it")
        if rule is None:
            raise UnsupportedOpError(
                f"no op rule for {describe(node, gm)}; add one with disco.graph.registry.register_*_rule"
            )
        split = [a.name for a in tensor_args(node, b) if a in b.csplit]
        if split and not rule.reads_split_channels:
            b.unsupported(node, f"reads {split[0]}, whose channels span several dims (a channel permutation "
                                "must end in a view that merges them back)")
        if isinstance(rule, Mixing):
            module = rule.weight_view(node, gm)
        else:
            module = gm.get_submodule(node.target) if node.op == "call_module" else None
        rule.infer(b, node, module)
        rules[node.name] = b.rule_of.get(node, rule)

    # owners: blocks in creation order; the groups of unified atoms of a block that have no owner
    # yet (in order of first appearance) are split over the nodes in a balanced, contiguous way
    roots_owner = np.full(len(b.uf.parent), REPLICATED, dtype=np.int64)
    for block in b.blocks:
        roots = b.uf.find(block)
        uniq, first = np.unique(roots, return_index=True)
        groups = uniq[np.argsort(first)]
        groups = groups[roots_owner[groups] == REPLICATED]
        roots_owner[groups] = split_owner(len(groups), nodes, shares)

    def owner_of(atoms: np.ndarray) -> np.ndarray:
        out = np.full(len(atoms), REPLICATED, dtype=np.int64)
        live = atoms != REPLICATED
        out[live] = roots_owner[b.uf.find(atoms[live])]
        return out

    owner: dict[str, np.ndarray | None] = {}
    base: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    base_names: list[str] = []
    relayed: set[fx.Node] = set()
    for node in gm.graph.nodes:
        atoms = b.atoms.get(node)
        if atoms is None:
            owner[node.name] = None
            continue
        owner[node.name] = owner_of(atoms)
        src = _relay_source(b, node, rules.get(node.name), relayed) if relay else None
        if node in b.sources:  # a view: channels of its operands
            ts, cs = zip(*[(base[a.name][0][idx], base[a.name][1][idx]) for a, idx in b.sources[node]], strict=True)
            base[node.name] = (np.concatenate(ts), np.concatenate(cs))
        elif src is not None:  # sent before this op; the receiver applies it
            relayed.add(node)
            base[node.name] = base[src.name]
        else:
            base_names.append(node.name)
            base[node.name] = (np.full(len(atoms), len(base_names) - 1), np.arange(len(atoms)))

    out_node = next(nd for nd in gm.graph.nodes if nd.op == "output")
    for a in out_node.all_input_nodes:
        if a in b.csplit:
            b.unsupported(a, "is an output whose channels span several dims")
    layers, links, link_tensors = _find_links(gm, b, rules, owner, base, base_names, nodes)
    part = Partition(
        nodes=nodes, gm=gm, input_shape=tuple(example.shape), owner=owner,
        cdim={n.name: c for n, c in b.cdim.items()}, base=base, base_names=base_names, layers=layers,
        links=links, link_tensors=link_tensors, rules=rules, param_nodes=frozenset(param_nodes), shares=shares,
        gathers={n.name: (src.name, idx) for n, (src, idx) in b.gathers.items()},
        relay=relay, relayed=frozenset(n.name for n in relayed),
    )
    log.info("partitioned %s over %d nodes: %d mixing layers, %d links", type(model).__name__, nodes,
             len(layers), len(links))
    return part


def _relay_source(b: Builder, node: fx.Node, rule: Rule | None, relayed: set[fx.Node]) -> fx.Node | None:
    """The input whose channels ``node`` may be sent as (the receiver then applies ``node`` itself), or None.

    ``node`` must be a channel-local op of one feature tensor that keeps its channels (same atoms, same
    channel dim) and does not shrink the plane (a pooling is cheaper to send after); and the channels
    must gain from being sent earlier: the input is a view (its channels may be read through several
    such chains: a DenseNet concatenation), an op already relayed, or ``node`` enlarges the plane."""
    if rule is None or rule.kind != "local" or node.op not in ("call_module", "call_function", "call_method"):
        return None
    ins = tensor_args(node, b)
    if len(ins) != 1 or b.replicated(ins[0]):
        return None
    a = ins[0]
    if b.cdim[a] != b.cdim[node] or not np.array_equal(b.atoms[a], b.atoms[node]):
        return None
    s_in, s_out = b.shape(a), b.shape(node)
    plane_in, plane_out = math.prod(s_in) // s_in[b.cdim[a]], math.prod(s_out) // s_out[b.cdim[node]]
    if plane_out < plane_in:
        return None
    return a if (plane_out > plane_in or a in b.sources or a in relayed) else None


def _find_links(gm, b, rules, owner, base, base_names, nodes):  # noqa: ANN001,ANN202
    by_name = {n.name: n for n in gm.graph.nodes}
    raw: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    layer_specs = []
    seen_modules: set[tuple[str, str]] = set()
    for node in gm.graph.nodes:
        rule = rules.get(node.name)
        if not isinstance(rule, Mixing):
            continue
        module = rule.weight_view(node, gm)
        if (module.path, module.param) in seen_modules:
            b.unsupported(node, "is called more than once (shared weights need one mask per call)")
        seen_modules.add((module.path, module.param))
        x = next(a for a in node.all_input_nodes if b.atoms.get(a) is not None)
        o, i, g = rule.structure(module)
        out_owner = owner[node.name]
        col_owner = owner[x.name]
        present = np.zeros((nodes, g), dtype=bool)
        present[out_owner, np.arange(o) // (o // g)] = True
        reads = present[:, np.arange(i) // (i // g)]  # [N, I]
        need = reads & (col_owner[None, :] != REPLICATED) & (col_owner[None, :] != np.arange(nodes)[:, None])
        j_idx, i_idx = np.nonzero(need)
        bt, bc = base[x.name]
        raw.append((len(layer_specs), j_idx, i_idx, bt[i_idx], bc[i_idx]))
        layer_specs.append((node, module, rule, x, out_owner, reads, g))
    # deduplicate (tensor, receiver, channel) across all consumers
    maxc = max((len(base[n][0]) for n in base), default=1) + 1
    if raw:
        keys = np.concatenate([((bt * nodes + j) * maxc + bc) for _, j, _, bt, bc in raw])
    else:
        keys = np.zeros(0, dtype=np.int64)
    uniq, inverse = np.unique(keys, return_inverse=True)
    t_of = uniq // maxc // nodes
    # renumber tensors to the ones that have links, in graph order
    used = sorted(set(t_of.tolist()))
    remap = {t: k for k, t in enumerate(used)}
    link_tensors = [base_names[t] for t in used]

    def plane(name: str) -> int:
        shp = shape_of(by_name[name])
        return math.prod(shp) // shp[b.cdim[by_name[name]]]

    links = Links(
        tensor=np.array([remap[t] for t in t_of.tolist()], dtype=np.int64),
        receiver=(uniq // maxc) % nodes,
        channel=uniq % maxc,
        values=np.array([plane(base_names[t]) for t in t_of.tolist()], dtype=np.int64),
    )
    layers = []
    pos = 0
    for (node, module, rule, x, out_owner, reads, g), (_, j_idx, i_idx, _, _) in zip(layer_specs, raw, strict=True):
        col_link = np.where(reads, MixingLayer.LOCAL, MixingLayer.UNREAD).astype(np.int64)
        col_link[j_idx, i_idx] = inverse[pos:pos + len(j_idx)]
        pos += len(j_idx)
        layers.append(MixingLayer(
            name=module.path, node=node.name, rule=rule, input=x.name, out_owner=out_owner, col_link=col_link,
            macs_per_connection=rule.macs_per_connection(b, node, x, module), groups=g, param=module.param,
            bias=module.bias_name, in_owner=owner[x.name],
        ))
    return layers, links, link_tensors
