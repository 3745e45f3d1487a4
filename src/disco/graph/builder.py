"""The partitioner's working state while ownership is inferred: the :class:`~disco.graph.types.Builder`
that rules update (atoms per fx node, unified in a union-find; channel dims; views and gathers)."""

from __future__ import annotations

import numpy as np
from torch import fx

from .errors import unsupported
from .types import REPLICATED, Builder, Rule, shape_of


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


class OwnershipBuilder(Builder):
    """The :class:`~disco.graph.types.Builder` the partitioner gives the rules: atoms, channel dims and
    shapes per fx node, and what the partitioner reads back (the mixing ops' blocks, views, gathers)."""

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
        self.pinned: dict[fx.Node, int] = {}  # replicated tensors read per channel along this dim (see pin)

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
                   split: tuple[int, ...] | None = None, *, rule: Rule) -> None:
        self.set_view(node, [(src, np.asarray(idx, dtype=np.int64))], cdim)
        self.gathers[node] = (src, np.asarray(idx, dtype=np.int64))
        if split is not None and len(split) > 1:
            self.csplit[node] = tuple(split)
        self.use_rule(node, rule)

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

    def pin(self, node: fx.Node, reader: fx.Node, dim: int) -> None:
        """Replicated tensor ``node`` is read by ``reader`` with one entry per channel along ``dim`` (a bias per
        head, a class token): every rank holds it whole and reads the entries of its own channels there."""
        if self.pinned.get(node, dim) != dim or (node.op == "placeholder" and dim != self.cdim[node]):
            self.unsupported(reader, f"reads the replicated tensor '{node.name}' per channel along dim {dim}, "
                                     f"which another op reads along dim {self.pinned.get(node, self.cdim[node])}")
        self.pinned[node] = dim
        self.set(node, self.replicated_atoms(self.shape(node)[dim]), dim)

    def unsupported(self, node: fx.Node, why: str) -> None:
        raise unsupported(node, self.gm, why)

