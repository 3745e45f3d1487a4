"""Any reshape of a feature tensor, followed as data: which channel every element of the output belongs to.

A reshape is cut into *blocks*: runs of input dims and of output dims with equal products (B x N x C ->
B x N x h x d has the blocks B | N | C -> h x d). Only the block that holds the channel dim matters. For each
output dim of that block, every index along it reads some set of input channels (computed on the block's
index grid, which is small):

* one channel per index (a flatten, a merge of the channel dim with others, MobileViT's unfold): the output
  is a *view* of the input with that channel per position; no compute, no new link;
* a group of channels per index (the channels of a tensor split into attention heads, ``x.view(B, N, h, d)``
  or ``reshape(B, N, 3, h, d)``): the channels of each group are *coupled* (one node owns a whole head) and
  the output's channels are the groups, along that dim. Of the candidate dims, the innermost (the channels
  within a head, which attention contracts) and the dims a later op selects along (``unbind(0)`` of q, k, v)
  are left out; the one with the most groups is chosen (the heads).

A node runs the reshape on its own channels (the channel dim's size replaced by its count): its channels are
whole groups, in order, so its local tensor reshapes the same way.
"""

from __future__ import annotations

import math
import operator

import numpy as np
import torch
from torch import fx

from ..types import Builder, shape_of
from .base import arg

MAX_GRID = 1 << 24  # the largest block index grid followed (elements)


def blocks(s: tuple[int, ...], t: tuple[int, ...]) -> list[tuple[int, int, int, int]] | None:
    """(i0, i1, o0, o1): input dims i0..i1-1 hold the same elements as output dims o0..o1-1; None if the shapes
    do not pair up that way."""
    out: list[tuple[int, int, int, int]] = []
    i = o = 0
    while i < len(s) or o < len(t):
        i0, o0 = i, o
        if i >= len(s) or o >= len(t):
            if all(v == 1 for v in s[i:]) and all(v == 1 for v in t[o:]):
                out.append((i0, len(s), o0, len(t)))
                return out
            return None
        pi, po = s[i], t[o]
        i, o = i + 1, o + 1
        while pi != po:
            if pi < po:
                if i >= len(s):
                    return None
                pi, i = pi * s[i], i + 1
            else:
                if o >= len(t):
                    return None
                po, o = po * t[o], o + 1
        out.append((i0, i, o0, o))
    return out


def permutation(node: fx.Node, rank: int) -> list[int]:
    """The dim order of a ``permute`` or ``transpose`` (``swapaxes``) node: output dim k is input dim perm[k]."""
    if node.target in ("permute", torch.permute):
        p = node.args[1:] if not isinstance(node.args[1], (tuple, list)) else node.args[1]
        return [int(d) % rank for d in p]
    d0, d1 = (int(d) % rank for d in node.args[1:3])
    perm = list(range(rank))
    perm[d0], perm[d1] = d1, d0
    return perm


def selected_dims(node: fx.Node, dims: list[int]) -> set[int]:
    """Which of ``node``'s output ``dims`` a later op selects along (``unbind``, ``x[0]``), followed through
    permutes, transposes and ``contiguous``."""
    out: set[int] = set()
    todo = [(node, {d: d for d in dims})]
    while todo:
        n, where = todo.pop()
        shp = shape_of(n)
        if shp is None:
            continue
        rank = len(shp)
        for u in n.users:
            tgt = u.target if isinstance(u.target, str) else getattr(u.target, "__name__", "")
            if tgt in ("permute", "transpose", "swapaxes", "swapdims"):
                perm = permutation(u, rank)
                todo.append((u, {d: perm.index(p) for d, p in where.items()}))
            elif tgt == "contiguous":
                todo.append((u, where))
            elif tgt == "unbind":
                dim = int(arg(u, 1, "dim", 0)) % rank
                out |= {d for d, p in where.items() if p == dim}
            elif u.target is operator.getitem:
                idx = u.args[1] if isinstance(u.args[1], tuple) else (u.args[1],)
                out |= {d for d, p in where.items() if p < len(idx) and isinstance(idx[p], int)}
    return out


def permutes_channels_only(node: fx.Node, lo: int, hi: int) -> bool:
    """Does every use of ``node`` (its channels split over dims lo..hi-1) only permute those dims among
    themselves and merge them back (a channel shuffle), through permutes, transposes and ``contiguous``?"""
    for u in node.users:
        shp, out = shape_of(node), shape_of(u)
        if shp is None or out is None:
            return False
        rank = len(shp)
        tgt = u.target if isinstance(u.target, str) else getattr(u.target, "__name__", "")
        if tgt in ("permute", "transpose", "swapaxes", "swapdims"):
            perm = permutation(u, rank)
            span = range(lo, hi)
            if any((d in span) != (perm[d] in span) or (d not in span and perm[d] != d) for d in range(rank)):
                return False
            if not permutes_channels_only(u, lo, hi):
                return False
        elif tgt == "contiguous":
            if not permutes_channels_only(u, lo, hi):
                return False
        elif tgt in ("view", "reshape", "flatten", "reshape_as", "view_as") or u.target in (torch.reshape,
                                                                                           torch.flatten):
            if out != shp[:lo] + (math.prod(shp[lo:hi]),) + shp[hi:]:
                return False
        else:
            return False
    return True


def reshape_channels(b: Builder, node: fx.Node, x: fx.Node) -> bool:
    """Follow reshape ``node`` of ``x`` as data (see the module's docstring); False when the shapes do not
    pair up into blocks (the caller refuses)."""
    s, t, c = b.shape(x), b.shape(node), b.cdim[x]
    bl = blocks(s, t)
    if bl is None:
        return False
    i0, i1, o0, o1 = next(k for k in bl if k[0] <= c < k[1])
    size = math.prod(s[i0:i1])
    if size > MAX_GRID:
        b.unsupported(node, f"reshapes {s} -> {t} over a block of {size} elements, too many to follow")
    n_ch = len(b.atoms[x])
    inner = math.prod(s[c + 1:i1])
    grid = ((np.arange(size) // inner) % n_ch).reshape(t[o0:o1] if o1 > o0 else (1,))
    rows = {d: np.moveaxis(grid, d - o0, 0).reshape(t[d], -1) for d in range(o0, o1)}
    exact = [d for d, r in rows.items() if (r == r[:, :1]).all()]
    if exact:  # one input channel per index along some dim: a view
        d = max(exact, key=lambda k: (len(np.unique(rows[k][:, 0])), k))
        b.set_view(node, [(x, rows[d][:, 0].copy())], d)
        return True
    a = b.atoms[x]
    same = [d for d, r in rows.items() if (a[r] == a[r[:, :1]]).all()]
    if same:  # several input positions of one channel per index (MobileViT's fold of a channel merged with
        d = same[-1]  # the batch dim back): a tensor of its own, one channel per index
        b.set(node, a[rows[d][:, 0]], d)
        return True
    cands = list(range(o0, o1 - 1)) if o1 - o0 > 1 else [o0]
    chosen = [d for d in cands if d not in selected_dims(node, cands)] or cands
    d = max(chosen, key=lambda k: (_groups(rows[k], n_ch), k))
    if not (np.diff(grid.ravel()) > 0).all():
        b.unsupported(node, f"reshapes {s} -> {t}: groups channels merged with other dims (a node's channels would "
                            "not reshape the same way)")
    for r in rows[d]:  # every channel of a group (a head) gets one owner
        b.couple_atoms(np.full(len(r), a[r[0]]), a[r])
    b.set(node, a[rows[d][:, 0]], d)
    return True


def _groups(rows: np.ndarray, n: int) -> int:
    """How many groups the channels fall into when each row's channels are coupled."""
    parent = np.arange(n)

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for r in rows:
        root = find(int(r[0]))
        for v in np.unique(r[1:]).tolist():
            rv = find(v)
            if rv != root:
                parent[rv] = root
    return len({find(i) for i in range(n)})
