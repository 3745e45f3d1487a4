"""Attention written out as tensor ops on heads (LeViT, EfficientFormer, CoaT, MaxViT, EdgeNeXt, Swin): once a
reshape has split the channels into heads (:mod:`disco.graph.ops.reshape`: a head's channels are coupled and
the head dim is the channel dim), these ops are channel-local along it:

* ``q @ k`` (``matmul``) on batches of matrices: the head dim is a batch dim, so output head h reads head h of
  both operands (they are coupled). A channel dim that is the row dim of the left operand (or the column dim
  of the right one) is local too; a channel dim that the product contracts is refused (a mixing op).
* ``F.scaled_dot_product_attention(q, k, v)``: q, k and v coupled along the head dim.
* ``softmax`` over any dim but the channel dim, and ``unbind`` along any dim but the channel dim.

A replicated operand with one entry per head (a relative position bias, a mask) is read per head by each node
(:meth:`~disco.graph.types.Builder.pin`); one of size 1 there is broadcast.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import fx, nn

from ..registry import register_function_rule, register_method_rule
from ..types import Builder, Rule
from .base import Local, arg, tensor_args


def _align(b: Builder, node: fx.Node, main: fx.Node, other: fx.Node, out_dim: int) -> None:
    """``other`` (a replicated operand) read along output dim ``out_dim``: pinned where it has an entry per
    channel of ``main``, broadcast where it has one."""
    shp, out = b.shape(other), b.shape(node)
    d = out_dim - (len(out) - len(shp))
    if d < 0 or shp[d] == 1:
        return
    if shp[d] != len(b.atoms[main]):
        b.unsupported(node, f"reads '{other.name}' {shp} along the channel dim with {shp[d]} entries for "
                            f"{len(b.atoms[main])} channels")
    b.pin(other, node, d)


class MatMulRule(Rule):
    """``a @ b`` with the channel dim a batch dim (heads), the left operand's row dim or the right one's column
    dim: channel-local; refused where the product contracts the channel dim."""

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        xa, xb = node.args[0], node.args[1]
        out = b.shape(node)
        ro = len(out)
        owned = [(k, x) for k, x in enumerate((xa, xb))
                 if isinstance(x, fx.Node) and b.atoms.get(x) is not None and not b.replicated(x)]
        if not owned:
            b.unsupported(node, "has no node-owned operand")
        dims = {}
        for k, x in owned:
            r, c = len(b.shape(x)), b.cdim[x]
            if r < 2:
                b.unsupported(node, "multiplies a vector that holds channels")
            if (k == 0 and c == r - 1) or (k == 1 and c == r - 2):
                b.unsupported(node, f"contracts the channel dim of '{x.name}' (a mixing op, not attention)")
            dims[k] = c + (ro - r)
        if len(set(dims.values())) != 1:
            b.unsupported(node, "reads its operands' channels along different dims")
        out_dim = next(iter(dims.values()))
        if out_dim >= ro - 2 and len(owned) == 2:
            b.unsupported(node, "reads the channels of one operand along a matrix dim of the other")
        main = owned[0][1]
        for x in (xa, xb):
            if not isinstance(x, fx.Node) or b.atoms.get(x) is None or x is main:
                continue
            if b.replicated(x):
                if out_dim < ro - 2:
                    _align(b, node, main, x, out_dim)
            else:
                b.couple(node, main, x)
        b.set(node, b.atoms[main], out_dim)

    def flops_per_element(self, in_shape: tuple[int, ...] | None, out_shape: tuple[int, ...]) -> float:
        return 2.0 * in_shape[-1] if in_shape else 0.0


class SdpaRule(Rule):
    """``F.scaled_dot_product_attention(q, k, v, attn_mask)``: heads (a batch dim) split over the nodes."""

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        q, k, v = (arg(node, i, n, None) for i, n in enumerate(("query", "key", "value")))
        if arg(node, 4, "dropout_p", 0.0) not in (0, 0.0):
            b.unsupported(node, "has attention dropout (random at every call)")
        for x in (q, k, v):
            if not isinstance(x, fx.Node) or b.atoms.get(x) is None:
                b.unsupported(node, "takes a query, key or value that is not a feature tensor")
        main = next((x for x in (q, k, v) if not b.replicated(x)), q)
        c, r = b.cdim[main], len(b.shape(main))
        if c >= r - 2:
            b.unsupported(node, "has its channels in the token or feature dim (heads must be a batch dim)")
        for x in (q, k, v):
            if x is not main:
                if b.replicated(x):
                    _align(b, node, main, x, c)
                else:
                    if b.cdim[x] != c:
                        b.unsupported(node, "reads q, k and v with their heads along different dims")
                    b.couple(node, main, x)
        mask = arg(node, 3, "attn_mask", None)
        if isinstance(mask, fx.Node) and b.atoms.get(mask) is not None:
            if not b.replicated(mask):
                b.unsupported(node, "takes a node-owned attention mask")
            _align(b, node, main, mask, c)
        b.set(node, b.atoms[main], c)

    def flops_per_element(self, in_shape: tuple[int, ...] | None, out_shape: tuple[int, ...]) -> float:
        return 4.0 * in_shape[-1] * (in_shape[-2] if in_shape else 0) / max(1, out_shape[-1]) if in_shape else 0.0


class SoftmaxRule(Local):
    """softmax over a dim other than the channel dim: channel-local."""

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        x = tensor_args(node, b)[0]
        dim = arg(node, 1, "dim", None)
        if not isinstance(dim, int) or dim % len(b.shape(x)) == b.cdim[x]:
            b.unsupported(node, "is a softmax over the channel dim (or over an unnamed dim)")
        super().infer(b, node, module)


class UnbindRule(Rule):
    """``unbind(dim)`` along a dim other than the channel dim (q, k, v): every piece holds every channel; the op
    runs on each node's channels."""

    kind = "split"
    allocates = False

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        x = tensor_args(node, b)[0]
        shape, c = b.shape(x), b.cdim[x]
        dim = int(arg(node, 1, "dim", 0)) % len(shape)
        if dim == c:
            b.unsupported(node, "unbinds the channel dim")
        b.parts[node] = [(x, None)] * shape[dim]
        b.use_rule(node, _UNBIND_LOCAL)
        b.set_static(node)


_UNBIND_LOCAL = Local(flops=0)


class EinsumRule(Rule):
    """``torch.einsum(eq, *operands)`` whose node-owned operands share one letter at their channel dims, a letter
    of the output (a batch or free index: heads): channel-local along it; refused where it is contracted."""

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        eq = node.args[0]
        ops = list(node.args[1]) if len(node.args) == 2 and isinstance(node.args[1], (tuple, list)) else \
            list(node.args[1:])
        if not isinstance(eq, str) or "->" not in eq or "." in eq:
            b.unsupported(node, "has an equation without an explicit output or with '...'")
        lhs, out = eq.replace(" ", "").split("->")
        terms = lhs.split(",")
        owned = [(t, x) for t, x in zip(terms, ops, strict=True)
                 if isinstance(x, fx.Node) and b.atoms.get(x) is not None and not b.replicated(x)]
        if not owned:
            b.unsupported(node, "has no node-owned operand")
        letters = {t[b.cdim[x]] for t, x in owned}
        if len(letters) != 1 or any(t.count(next(iter(letters))) != 1 for t, _ in owned):
            b.unsupported(node, f"reads its operands' channels under different letters {sorted(letters)}")
        ch = letters.pop()
        if ch not in out:
            b.unsupported(node, f"contracts the channel dim (index '{ch}' of '{eq}'): a mixing op, not attention")
        main = owned[0][1]
        for t, x in zip(terms, ops, strict=True):
            if not isinstance(x, fx.Node) or b.atoms.get(x) is None or x is main:
                continue
            if not b.replicated(x):
                b.couple(node, main, x)
            elif ch in t and b.shape(x)[t.index(ch)] != 1:
                b.pin(x, node, t.index(ch))
        b.set(node, b.atoms[main], out.index(ch))

    def flops_per_element(self, in_shape: tuple[int, ...] | None, out_shape: tuple[int, ...]) -> float:
        return 2.0 * in_shape[-1] if in_shape else 0.0


def unbound_cdim(piece_of: fx.Node, c: int, rank: int) -> int:
    """The channel dim of a piece of ``unbind`` node ``piece_of`` whose input has its channels along ``c``."""
    if piece_of.target in ("unbind", torch.unbind):
        return c - (int(arg(piece_of, 1, "dim", 0)) % rank < c)
    return c


register_function_rule(torch.matmul, operator.matmul)(MatMulRule())
register_method_rule("matmul")(MatMulRule())
register_function_rule(F.scaled_dot_product_attention)(SdpaRule())
register_function_rule(torch.einsum, torch.functional.einsum)(EinsumRule())
register_function_rule(F.softmax, torch.softmax)(SoftmaxRule(flops=3))
register_method_rule("softmax")(SoftmaxRule(flops=3))
register_function_rule(torch.unbind)(UnbindRule())
register_method_rule("unbind")(UnbindRule())
