"""Partitioning: ownership of every feature tensor and the links between nodes.

Ownership is solved as data, not per architecture: every channel of every feature
tensor is an *atom*; mixing ops create fresh atoms, channel-local ops pass atoms
through, add/mul (and PixelShuffle groups) *unify* atoms in a union-find, and views
(cat, flatten) build index maps. Each group of unified atoms is then given one owner,
by a balanced contiguous split of the mixing op that created it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import fx, nn

from .builder import OwnershipBuilder
from .capture import capture
from .errors import UnsupportedOpError, describe, refusal
from .registry import rule_for, uncovered_base
from .types import REPLICATED, Links, MixingLayer, Partition, Rule, WeightView, shape_of, tensor_args

__all__ = ["check_shares", "partition", "share_sizes", "split_owner"]

log = logging.getLogger(__name__)


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
    b = OwnershipBuilder(gm, nodes)
    param_nodes = _param_nodes(gm)
    rules = _infer_ownership(b, param_nodes)
    t = _base_tensors(b, rules, _assign_owners(b, nodes, shares), relay)
    _check_outputs(b)
    layers, links, link_tensors = _find_links(b, rules, t)
    part = Partition(
        nodes=nodes, gm=gm, input_shape=tuple(example.shape), owner=t.owner,
        cdim={n.name: c for n, c in b.cdim.items()}, base=t.base, base_names=t.base_names, layers=layers,
        links=links, link_tensors=link_tensors, rules=rules, param_nodes=frozenset(param_nodes), shares=shares,
        gathers={n.name: (src.name, idx) for n, (src, idx) in b.gathers.items()},
        relay=relay, relayed=frozenset(n.name for n in t.relayed), shape_guards=tuple(gm.meta.get("shape_guards", ())),
    )
    log.info("partitioned %s over %d nodes: %d mixing layers, %d links", type(model).__name__, nodes,
             len(layers), len(links))
    return part


def _param_nodes(gm: fx.GraphModule) -> set[str]:
    """The ``get_attr`` nodes that ops read as their weights (F.linear on ``in_proj_weight``), not as tensors."""
    out: set[str] = set()
    for node in gm.graph.nodes:
        rule = rule_for(node, gm) if node.op.startswith("call_") else None
        if rule is not None:
            out.update(a.name for a in rule.param_nodes(node))
    return out


def _infer_ownership(b: OwnershipBuilder, param_nodes: set[str]) -> dict[str, Rule]:
    """Step 1: every value's atoms and channel dim, in graph order (inputs replicated, each op by its rule).
    Returns the rule each op node behaves by (a rule may hand a node to another: cat over tokens)."""
    rules: dict[str, Rule] = {}
    for node in b.gm.graph.nodes:
        shp = shape_of(node)
        if node.op in ("placeholder", "get_attr"):
            if shp is None or node.name in param_nodes or len(shp) == 0:
                b.set_static(node)
            else:
                _set_replicated(b, node, shp)
            continue
        if node.op == "output":
            continue
        ins = tensor_args(node, b)
        # an op of tensors every node holds whole (a bias table indexed by a buffer) may be computed whole by each
        whole = shp is not None and bool(ins) and all(b.replicated(a) for a in ins) and node.op != "call_module"
        rule = rule_for(node, b.gm) if whole else _rule_of(b, node)
        if rule is None and whole:
            _set_replicated(b, node, shp)
            rules[node.name] = REPLICATED_OP
            continue
        if rule is None:
            b.set_static(node)  # arithmetic on sizes and flags: computed on every node
            continue
        split = [a.name for a in ins if a in b.csplit]
        if split and not rule.reads_split_channels:
            b.unsupported(node, f"reads {split[0]}, whose channels span several dims (a channel permutation "
                                "must end in a view that merges them back)")
        try:
            rule.infer(b, node, rule.module_of(node, b.gm))
        except UnsupportedOpError:
            if not whole or rule.is_mixing or rule.kind == "split":
                raise
            _set_replicated(b, node, shp)  # e.g. indexing by a tensor, which the rule refuses on split tensors
            rules[node.name] = REPLICATED_OP
            continue
        rules[node.name] = b.rule_of.get(node, rule)
    return rules


def _set_replicated(b: OwnershipBuilder, node: fx.Node, shp: tuple[int, ...]) -> None:
    """A tensor every node holds whole: channels along dim 1 (images), the last dim for B x T x D tokens (a
    channel-local op that reads it per channel pins the dim it reads: :meth:`OwnershipBuilder.pin`)."""
    if len(shp) == 0:
        b.set_static(node)
        return
    cd = len(shp) - 1 if (len(shp) == 3 or len(shp) < 2) else 1
    b.set(node, np.full(shp[cd], REPLICATED), cd)


REPLICATED_OP = Rule()  # the rule of an op computed whole on every node (every tensor it reads is replicated)


def _rule_of(b: OwnershipBuilder, node: fx.Node) -> Rule | None:
    """The rule of call node ``node``; None for a value that is neither a tensor nor reads one (sizes, flags).
    Raises :class:`UnsupportedOpError` for any other op without a rule."""
    gm = b.gm
    rule = rule_for(node, gm)
    if rule is not None:
        return rule
    if shape_of(node) is None and not tensor_args(node, b):
        return None
    if node.op == "call_module":
        base = uncovered_base(type(gm.get_submodule(node.target)))
        if base is not None:
            raise refusal(node,
                f"{describe(node, gm)} is a subclass of {base.__name__} that redefines its forward, which the "
                f"rule for {base.__name__} does not describe; register a rule for it")
    raise refusal(node, f"no op rule for {describe(node, gm)}; add one with disco.graph.registry.register_*_rule")


def _assign_owners(b: OwnershipBuilder, nodes: int, shares: tuple[float, ...] | None
                   ) -> Callable[[np.ndarray], np.ndarray]:
    """Step 2: owners. Blocks in creation order; the groups of unified atoms of a block that have no owner
    yet (in order of first appearance) are split over the nodes in a balanced, contiguous way. Returns the
    owner of each of some atoms (REPLICATED stays REPLICATED)."""
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

    return owner_of


@dataclass
class _Tensors:
    """Per value: its owners, and the base tensor and channel each of its channels is sent as."""

    owner: dict[str, np.ndarray | None] = field(default_factory=dict)
    base: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # (base tensor idx, channel)
    base_names: list[str] = field(default_factory=list)
    relayed: set[fx.Node] = field(default_factory=set)  # ops the receivers apply (see ``relay``)


def _base_tensors(b: OwnershipBuilder, rules: dict[str, Rule], owner_of: Callable[[np.ndarray], np.ndarray],
                  relay: bool) -> _Tensors:
    """Step 3: owners per value, and the tensors channels are sent as: a view's channels are its
    operands'; a relayed op's are its input's; any other value is a base tensor of its own."""
    t = _Tensors()
    for node in b.gm.graph.nodes:
        atoms = b.atoms.get(node)
        if atoms is None:
            t.owner[node.name] = None
            continue
        t.owner[node.name] = owner_of(atoms)
        src = _relay_source(b, node, rules.get(node.name), t.relayed) if relay else None
        if node in b.sources:  # a view: channels of its operands
            ts, cs = zip(*[(t.base[a.name][0][idx], t.base[a.name][1][idx]) for a, idx in b.sources[node]],
                         strict=True)
            t.base[node.name] = (np.concatenate(ts), np.concatenate(cs))
        elif src is not None:  # sent before this op; the receiver applies it
            t.relayed.add(node)
            t.base[node.name] = t.base[src.name]
        else:
            t.base_names.append(node.name)
            t.base[node.name] = (np.full(len(atoms), len(t.base_names) - 1), np.arange(len(atoms)))
    return t


def _check_outputs(b: OwnershipBuilder) -> None:
    """The model's outputs have their channels along one dim."""
    out_node = next(nd for nd in b.gm.graph.nodes if nd.op == "output")
    for a in out_node.all_input_nodes:
        if a in b.csplit:
            b.unsupported(a, "is an output whose channels span several dims")


def _relay_source(b: OwnershipBuilder, node: fx.Node, rule: Rule | None, relayed: set[fx.Node]) -> fx.Node | None:
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




@dataclass
class _Reads:
    """What one mixing op reads: per rank, the input columns it needs and the ones it lacks (a link each)."""

    node: fx.Node
    view: WeightView
    rule: Rule
    x: fx.Node  # its feature-tensor input
    reads: np.ndarray  # [N, I] bool: rank j computes rows that read input channel i
    groups: int
    need_rank: np.ndarray  # the (rank, input channel) pairs a rank reads but does not hold ...
    need_col: np.ndarray
    base_tensor: np.ndarray  # ... and the base tensor and channel each is sent as
    base_channel: np.ndarray


def _reads(b: OwnershipBuilder, node: fx.Node, rule: Rule, t: _Tensors) -> _Reads:
    view = rule.module_of(node, b.gm)
    x = next(a for a in node.all_input_nodes if b.atoms.get(a) is not None)
    o, i, g = rule.structure(view)
    col_owner = t.owner[x.name]
    present = np.zeros((b.ranks, g), dtype=bool)
    present[t.owner[node.name], np.arange(o) // (o // g)] = True
    reads = present[:, np.arange(i) // (i // g)]  # [N, I]
    need = reads & (col_owner[None, :] != REPLICATED) & (col_owner[None, :] != np.arange(b.ranks)[:, None])
    j_idx, i_idx = np.nonzero(need)
    bt, bc = t.base[x.name]
    return _Reads(node, view, rule, x, reads, g, j_idx, i_idx, bt[i_idx], bc[i_idx])


def _find_links(b: OwnershipBuilder, rules: dict[str, Rule], t: _Tensors
                ) -> tuple[list[MixingLayer], Links, list[str]]:
    """Step 4: the links, one per (base tensor, receiving rank, channel) that a mixing op reads on a rank
    that does not hold it (shared by all its readers), and each mixing op's layer: its columns' links."""
    specs: list[_Reads] = []
    seen_modules: set[tuple[str, str]] = set()
    for node in b.gm.graph.nodes:
        rule = rules.get(node.name)
        if rule is None or not rule.is_mixing:
            continue
        r = _reads(b, node, rule, t)
        if (r.view.path, r.view.param) in seen_modules:
            b.unsupported(node, "is called more than once (shared weights need one mask per call)")
        seen_modules.add((r.view.path, r.view.param))
        specs.append(r)
    links, link_tensors, inverse = _dedupe_links(b, specs, t)
    layers = []
    pos = 0
    for r in specs:
        col_link = np.where(r.reads, MixingLayer.LOCAL, MixingLayer.UNREAD).astype(np.int64)
        col_link[r.need_rank, r.need_col] = inverse[pos:pos + len(r.need_rank)]
        pos += len(r.need_rank)
        layers.append(MixingLayer(
            name=r.view.path, node=r.node.name, rule=r.rule, input=r.x.name, out_owner=t.owner[r.node.name],
            col_link=col_link, macs_per_connection=r.rule.macs_per_connection(b, r.node, r.x, r.view),
            groups=r.groups, param=r.view.param, bias=r.view.bias_name, in_owner=t.owner[r.x.name],
        ))
    return layers, links, link_tensors


def _dedupe_links(b: OwnershipBuilder, specs: list[_Reads], t: _Tensors) -> tuple[Links, list[str], np.ndarray]:
    """The distinct (base tensor, receiver, channel) of all reads, the tensors that have links (in graph
    order), and the link id of each read (in the order of ``specs``)."""
    nodes = b.ranks
    maxc = max((len(t.base[n][0]) for n in t.base), default=1) + 1
    if specs:
        keys = np.concatenate([((r.base_tensor * nodes + r.need_rank) * maxc + r.base_channel) for r in specs])
    else:
        keys = np.zeros(0, dtype=np.int64)
    uniq, inverse = np.unique(keys, return_inverse=True)
    t_of = uniq // maxc // nodes
    # renumber tensors to the ones that have links, in graph order
    used = sorted(set(t_of.tolist()))
    remap = {k: n for n, k in enumerate(used)}
    link_tensors = [t.base_names[k] for k in used]
    by_name = {n.name: n for n in b.gm.graph.nodes}

    def plane(name: str) -> int:
        shp = shape_of(by_name[name])
        return math.prod(shp) // shp[b.cdim[by_name[name]]]

    links = Links(
        tensor=np.array([remap[k] for k in t_of.tolist()], dtype=np.int64),
        receiver=(uniq // maxc) % nodes,
        channel=uniq % maxc,
        values=np.array([plane(t.base_names[k]) for k in t_of.tolist()], dtype=np.int64),
    )
    return links, link_tensors, inverse
