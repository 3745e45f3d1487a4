"""Op rules: how channel ownership flows through each op, and which ops mix channels.

A rule is a small stateless object registered for a module type, a function or a
method name. The partitioner never looks at an op's type itself: it asks the rule.

Kinds of rule:

* ``local``   channel-local compute (BatchNorm, activations, pooling, add, mul, ...):
  each output channel is computed from the same channel of the inputs, so output
  ownership follows input ownership; operands of add/mul are *coupled* (unified).
* ``view``    no compute and no new link (cat, flatten, identity, dropout): every
  output channel *is* a channel of an input, given as an index map.
* ``mixing``  output channels read many input channels (Conv2d, ConvTranspose2d,
  Linear): output channels get a fresh balanced ownership; the weight columns that
  cross nodes are the links, and the ones the kept set drops are masked.
* ``static``  values that are not feature tensors (``x.size(0)``): computed everywhere.
"""

from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from .errors import unsupported
from .registry import (  # noqa: F401  (rule_for: re-exported for older imports)
    module_rule,
    register_function_rule,
    register_method_rule,
    register_module_rule,
    rule_for,
)

if TYPE_CHECKING:
    from .partition import Builder

def tensor_args(node: fx.Node, b: Builder) -> list[fx.Node]:
    """The node's arguments that are feature tensors, in order."""
    out: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), lambda a: out.append(a) if b.atoms.get(a) is not None else None)
    return out


def arg(node: fx.Node, i: int, name: str, default: Any) -> Any:
    """Argument ``i`` of a call node, or its keyword ``name``, or ``default``."""
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


class Rule:
    """Base rule. Subclasses set ``kind`` and implement :meth:`infer`."""

    kind: ClassVar[str] = "local"
    allocates: ClassVar[bool] = True  # does the op allocate its output (views may not)
    forward_names: ClassVar[tuple[str, ...]] = ("forward",)  # a subclass redefining one is not covered
    reads_split_channels: ClassVar[bool] = False  # may its input have channels over several dims (shuffle)

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        raise NotImplementedError

    def flops_per_element(self, in_shape: tuple[int, ...] | None, out_shape: tuple[int, ...]) -> float:
        """FLOPs per output element (local rules): by default input size / output size, at least 1."""
        if in_shape is None:
            return 0.0
        return max(1.0, math.prod(in_shape) / max(1, math.prod(out_shape)))


class Static(Rule):
    """A value that is not a feature tensor (sizes, shapes): computed on every node."""

    kind = "static"
    allocates = False

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        if b.shape(node) is not None and tensor_args(node, b):
            b.unsupported(node, "returns a tensor derived from a feature tensor, which a static rule cannot own")
        b.set_static(node)


class Local(Rule):
    """Channel-local unary op: output channel c depends on input channel c only."""

    def __init__(self, flops: float | None = None) -> None:
        self._flops = flops

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        ins = tensor_args(node, b)
        if not ins:
            b.unsupported(node, "has no feature-tensor input")
        x = ins[0]
        cdim = b.cdim[x]
        out = b.shape(node)
        if out is None or len(out) <= cdim or out[cdim] != len(b.atoms[x]):
            b.unsupported(node, f"changes the channel dimension ({b.shape(x)} -> {out})")
        for other in ins[1:]:  # e.g. a gate passed as a second argument
            b.couple(node, x, other)
        b.set(node, b.atoms[x], cdim)

    def flops_per_element(self, in_shape: tuple[int, ...] | None, out_shape: tuple[int, ...]) -> float:
        return self._flops if self._flops is not None else super().flops_per_element(in_shape, out_shape)


class Elementwise(Rule):
    """add, mul, sub, div with broadcasting: operands of equal channel count are coupled."""

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        ins = tensor_args(node, b)
        out = b.shape(node)
        if out is None:
            b.set_static(node)
            return
        full = [a for a in ins if b.shape(a) == out] or ins
        main = next((a for a in full if not b.replicated(a)), full[0])
        cdim = b.cdim[main]
        for other in ins:
            if other is main:
                continue
            shp = b.shape(other)
            d = cdim - (len(out) - len(shp))
            if d < 0 or shp[d] == 1:  # broadcast over channels
                if not b.replicated(other):
                    b.unsupported(node, "broadcasts a node-owned tensor over the channels of another")
                continue
            if other.op == "get_attr" and b.cdim[other] != d and shp[d] == len(b.atoms[main]):
                # a parameter with one entry per channel of ``main`` (ConvNeXt's layer scale, C x 1 x 1):
                # every node holds it and reads the entries of its own channels
                b.set(other, b.replicated_atoms(shp[d]), d)
            b.couple(node, main, other)
        b.set(node, b.atoms[main], cdim)


class View(Rule):
    """Identity-like ops (Identity, Dropout, contiguous): the output is the input."""

    kind = "view"
    allocates = False

    reads_split_channels = True

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        x = tensor_args(node, b)[0]
        if x in b.csplit:
            b.set_gather(node, x, np.arange(len(b.atoms[x])), b.cdim[x], b.csplit[x])
            return
        b.set_view(node, [(x, np.arange(len(b.atoms[x])))], b.cdim[x])


class Gather(Rule):
    """A selection or permutation of channels with no compute (channel shuffle, chunk, ``x[:, a:b]``): a
    node runs it as an index selection on its own channels (see ``Builder.set_gather``)."""

    kind = "view"

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        raise NotImplementedError("set by other rules through Builder.set_gather")


GATHER = Gather()


class Cat(Rule):
    """torch.cat: along the channel dim a view (index map); along another dim operands are coupled."""

    kind = "view"

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        ins = [a for a in arg(node, 0, "tensors", []) if isinstance(a, fx.Node)]
        rank = len(b.shape(node))
        dim = arg(node, 1, "dim", 0) % rank
        if any(b.atoms.get(a) is None for a in ins):
            b.unsupported(node, "concatenates a value that is not a feature tensor")
        cdims = {b.cdim[a] for a in ins if not b.replicated(a)} or {b.cdim[a] for a in ins}
        if len(cdims) != 1:
            b.unsupported(node, "concatenates tensors whose channel dims differ")
        cdim = cdims.pop()
        if dim == cdim:
            b.set_view(node, [(a, np.arange(len(b.atoms[a]))) for a in ins], cdim)
        else:  # e.g. a class token joining the patch tokens: a local op, operands coupled per channel
            main = next((a for a in ins if not b.replicated(a)), ins[0])
            for other in ins:
                if other is not main and not b.replicated(other):
                    b.couple(node, main, other)
            b.set(node, b.atoms[main], cdim)
            b.use_rule(node, _CAT_LOCAL)


_CAT_LOCAL = Local(flops=0)  # the rule a concatenation along a non-channel dim behaves by


class Flatten(Rule):
    """flatten / view / reshape that merges a run of dims (the only reshapes supported)."""

    kind = "view"
    allocates = False

    reads_split_channels = True

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        x = tensor_args(node, b)[0]
        s, t, c = b.shape(x), b.shape(node), b.cdim[x]
        n_ch = len(b.atoms[x])
        if x in b.csplit:  # channels over dims c..c+k-1: only merging exactly those back is supported
            k = len(b.csplit[x])
            if t != s[:c] + (n_ch,) + s[c + k:]:
                b.unsupported(node, f"reshapes {s} -> {t}, whose channels span dims {c}..{c + k - 1}; only "
                                    "merging those dims back into one is supported")
            b.set_gather(node, x, np.arange(n_ch), c)
            return
        k = len(t) - len(s) + 1
        if k > 1 and t[:c] == s[:c] and t[c + k:] == s[c + 1:] and math.prod(t[c:c + k]) == s[c]:
            b.set_gather(node, x, np.arange(n_ch), c, tuple(t[c:c + k]))  # the channel dim split in k dims
            return
        span = _merged_span(s, t)
        if span is None:
            b.unsupported(node, f"reshapes {s} -> {t}, which is not a flatten of consecutive dims")
        lo, hi = span
        if c < lo:
            b.set_view(node, [(x, np.arange(n_ch))], c)
        elif c > hi:
            b.set_view(node, [(x, np.arange(n_ch))], c - (hi - lo))
        else:  # the channel dim is merged: every output feature is one channel's value
            inner = math.prod(s[c + 1:hi + 1])
            idx = (np.arange(math.prod(s[lo:hi + 1])) // inner) % n_ch
            b.set_view(node, [(x, idx)], lo)


def _merged_span(s: tuple[int, ...], t: tuple[int, ...]) -> tuple[int, int] | None:
    """If ``t`` is ``s`` with dims lo..hi merged into one, return (lo, hi)."""
    if s == t:
        return (len(s), len(s) - 1)  # nothing merged: an empty span past the end
    k = len(s) - len(t)
    if k < 1:
        return None
    for lo in range(len(t)):
        hi = lo + k
        if s[:lo] == t[:lo] and s[hi + 1:] == t[lo + 1:] and math.prod(s[lo:hi + 1]) == t[lo]:
            return (lo, hi)
    return None


class MeanRule(Rule):
    """x.mean(dims): channel-local when the channel dim is not reduced."""

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        x = tensor_args(node, b)[0]
        rank, c = len(b.shape(x)), b.cdim[x]
        dims = arg(node, 1, "dim", None)
        dims = list(range(rank)) if dims is None else ([dims] if isinstance(dims, int) else list(dims))
        dims = [d % rank for d in dims]
        if c in dims:
            b.unsupported(node, "reduces over the channel dim")
        keep = arg(node, 2, "keepdim", False)
        b.set(node, b.atoms[x], c if keep else c - sum(d < c for d in dims))


class PixelShuffleRule(Rule):
    """PixelShuffle(r): the r*r input channels of one output channel are coupled (same owner)."""

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        x = tensor_args(node, b)[0]
        r2 = module.upscale_factor ** 2
        a = b.atoms[x]
        for k in range(1, r2):
            b.couple_atoms(a[0::r2], a[k::r2])
        b.set(node, a[0::r2], b.cdim[x])


class PixelUnshuffleRule(Rule):
    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        x = tensor_args(node, b)[0]
        b.set(node, np.repeat(b.atoms[x], module.downscale_factor ** 2), b.cdim[x])


class Transpose(Rule):
    """transpose / permute: the data moves, the channels do not change owner."""

    reads_split_channels = True

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        x = tensor_args(node, b)[0]
        rank, c = len(b.shape(x)), b.cdim[x]
        if node.target in ("permute", torch.permute):
            p = node.args[1:] if not isinstance(node.args[1], (tuple, list)) else node.args[1]
            perm = [int(d) % rank for d in p]
        else:
            d0, d1 = (int(d) % rank for d in node.args[1:3])
            perm = list(range(rank))
            perm[d0], perm[d1] = d1, d0
        if x in b.csplit:  # a permutation of the channels: the dims they span are reordered among themselves
            sizes = b.csplit[x]
            span = list(range(c, c + len(sizes)))
            if any((d in span) != (perm[d] in span) or (d not in span and perm[d] != d) for d in range(rank)):
                b.unsupported(node, "moves a dim of a channel group to or from another dim")
            axes = [perm[d] - c for d in span]
            idx = np.arange(len(b.atoms[x])).reshape(sizes).transpose(axes).reshape(-1)
            b.set_gather(node, x, idx, c, tuple(sizes[a] for a in axes))
            return
        b.set(node, b.atoms[x], perm.index(c))

    def flops_per_element(self, in_shape: tuple[int, ...] | None, out_shape: tuple[int, ...]) -> float:
        return 0.0


class GetItem(Rule):
    """``x[...]``: indexing that keeps the whole channel dim (e.g. the class token ``x[:, 0]``);
    on non-tensors (sizes) a static value."""

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        x = node.args[0]
        if isinstance(x, fx.Node) and x in b.parts:  # a piece of a chunk / split
            src, sel = b.parts[x][node.args[1]]
            if sel is None:  # split along another dim: the piece holds every channel
                b.set(node, b.atoms[src], b.cdim[src])
            else:
                b.set_gather(node, src, sel, b.cdim[src])
            return
        if not isinstance(x, fx.Node) or b.atoms.get(x) is None:
            Static().infer(b, node, module)
            return
        idx = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
        if any(i is Ellipsis or i is None or isinstance(i, fx.Node) for i in idx):
            b.unsupported(node, "indexes a feature tensor with ..., None or a tensor")
        c = b.cdim[x]
        if c < len(idx) and idx[c] != slice(None):
            if not isinstance(idx[c], slice) or any(i != slice(None) for k, i in enumerate(idx) if k != c):
                b.unsupported(node, "selects part of the channel dim together with other dims, or by an integer")
            b.set_gather(node, x, np.arange(len(b.atoms[x]))[idx[c]], c)
            return
        b.set(node, b.atoms[x], c - sum(isinstance(i, int) for i in idx[:c]))

    def flops_per_element(self, in_shape: tuple[int, ...] | None, out_shape: tuple[int, ...]) -> float:
        return 0.0


class Reduce(Local):
    """A channel reduction kept exact (LayerNorm over the channel dim): ownership passes through;
    the nodes all-reduce ``stats`` values per normalised position (counted apart from links)."""

    kind = "reduce"
    stats = 2  # sum and sum of squares

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        x = tensor_args(node, b)[0]
        shape = getattr(module, "normalized_shape", None)
        if shape is not None and len(shape) != 1:
            b.unsupported(node, f"normalises over the last {len(shape)} dims, more than the channel dim")
        if shape is not None and b.cdim[x] != self.norm_dim(b.shape(x)):
            b.unsupported(node, f"normalises dim {self.norm_dim(b.shape(x))} of {b.shape(x)}, which is not "
                                f"the channel dim ({b.cdim[x]})")
        super().infer(b, node, module)

    def norm_dim(self, shape: tuple[int, ...]) -> int:
        """The dim the op normalises over: the last one (``nn.LayerNorm``)."""
        return len(shape) - 1

    def partial(self, x: Tensor, cdim: int) -> Tensor:
        """This node's per-position statistics over its own channels, ``stats`` of them on a new last dim."""
        if x.shape[cdim]:
            mean = x.mean(cdim)
            m2 = (x - mean.unsqueeze(cdim)).pow(2).sum(cdim)
        else:
            mean = m2 = torch.zeros(x.shape[:cdim] + x.shape[cdim + 1:], dtype=x.dtype)
        return torch.stack([mean, m2], -1)

    def finish(self, module: nn.Module | None, node: fx.Node, x: Tensor, cdim: int, parts: Tensor,
               counts: Tensor) -> Tensor:
        """The op on this node's channels ``x`` from every node's statistics ``parts`` [N, ..., stats]
        and channel counts ``counts`` [N]: LayerNorm combines (mean, M2) by Chan et al."""
        n = counts.view(-1, *([1] * (parts.dim() - 2)))
        total = counts.sum()
        g_mean = (parts[..., 0] * n).sum(0) / total
        g_m2 = (parts[..., 1] + n * (parts[..., 0] - g_mean).pow(2)).sum(0)
        y = (x - g_mean.unsqueeze(cdim)) / torch.sqrt(g_m2.unsqueeze(cdim) / total + module.eps)
        shape = [1] * y.dim()
        shape[cdim] = -1
        if getattr(module, "weight", None) is not None:
            y = y * module.weight.view(shape)
        if getattr(module, "bias", None) is not None:
            y = y + module.bias.view(shape)
        return y


class ChannelsFirstLayerNorm(Reduce):
    """LayerNorm over dim 1 of an NCHW tensor (torchvision's and timm's ``LayerNorm2d``: permute, layer_norm
    over the last dim, permute back): the same exact reduction over the channel dim."""

    def norm_dim(self, shape: tuple[int, ...]) -> int:
        return 1


class L2NormRule(Reduce):
    """``x / max(||x||_2, eps)`` over the channel dim (``F.normalize(x, dim=cdim)``, or a module with
    ``eps`` and an optional per-channel ``weight``, e.g. SSD's L2Norm): one statistic per position,
    the sum of squares of the node's own channels."""

    stats = 1

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        x = tensor_args(node, b)[0]
        p, dim = (arg(node, 1, "p", 2.0), arg(node, 2, "dim", 1)) if module is None else (2, module.dim)
        if p != 2 or dim % len(b.shape(x)) != b.cdim[x]:
            b.unsupported(node, "normalises other than the L2 norm over the channel dim")
        Local.infer(self, b, node, module)

    def partial(self, x: Tensor, cdim: int) -> Tensor:
        return x.pow(2).sum(cdim).unsqueeze(-1)

    def finish(self, module: nn.Module | None, node: fx.Node, x: Tensor, cdim: int, parts: Tensor,
               counts: Tensor) -> Tensor:
        eps = module.eps if module is not None else arg(node, 3, "eps", 1e-12)
        norm = parts[..., 0].sum(0).sqrt().clamp_min(eps).unsqueeze(cdim)
        y = x / norm
        w = getattr(module, "weight", None)
        if w is not None:
            shape = [1] * y.dim()
            shape[cdim] = -1
            y = y * w.view(shape)
        return y


class ChunkRule(Rule):
    """``torch.chunk`` / ``torch.split`` (and the methods): along the channel dim each piece is a selection
    of channels (a gather, and the op itself is not run on the nodes); along another dim the op runs on
    each node's channels and every piece holds all of them."""

    kind = "split"
    allocates = False

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        x = tensor_args(node, b)[0]
        shape, c = b.shape(x), b.cdim[x]
        fn = node.target if isinstance(node.target, str) else node.target.__name__
        size = arg(node, 1, "chunks" if fn == "chunk" else "split_size_or_sections", None)
        if size is None:
            size = arg(node, 1, "split_size", None)
        dim = arg(node, 2, "dim", 0) % len(shape)
        if isinstance(size, fx.Node):
            b.unsupported(node, "splits by a size computed in the graph")
        n = shape[dim]
        if fn == "chunk":
            step = -(-n // int(size))
            sizes = [min(step, n - k) for k in range(0, n, step)]
        elif isinstance(size, int):
            sizes = [min(size, n - k) for k in range(0, n, size)]
        else:
            sizes = [int(v) for v in size]
        if dim != c:
            b.parts[node] = [(x, None)] * len(sizes)
            b.use_rule(node, _SPLIT_OTHER_DIM)
        else:
            bounds = np.cumsum([0, *sizes])
            b.parts[node] = [(x, np.arange(lo, hi)) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
        b.set_static(node)


_SPLIT_OTHER_DIM = Local(flops=0)  # chunk/split along a non-channel dim: runs on each node's channels


class PadRule(Local):
    """Padding of the trailing (spatial) dims (``F.pad``, ``nn.ZeroPad2d``, ``nn.ConstantPad2d``,
    reflection and replication padding): channel-local unless it pads the channel dim."""

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        x = tensor_args(node, b)[0]
        pad = module.padding if module is not None else arg(node, 1, "pad", ())
        if isinstance(pad, fx.Node):
            b.unsupported(node, "pads by amounts computed in the graph")
        n = len(pad) // 2 if isinstance(pad, (tuple, list)) else 1
        if b.cdim[x] >= len(b.shape(x)) - n:
            b.unsupported(node, "pads the channel dim")
        super().infer(b, node, module)

    def flops_per_element(self, in_shape: tuple[int, ...] | None, out_shape: tuple[int, ...]) -> float:
        return 0.0


class InferenceIdentity(View):
    """Ops that are the identity at inference (stochastic depth, drop path): a view. The function form
    must have been traced with ``training=False``."""

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        if module is None and arg(node, 3, "training", True) is not False:
            b.unsupported(node, "was traced in training mode (random at every call); partition the model in "
                                "eval mode")
        super().infer(b, node, module)


class LocalWithChildren(Local):
    """A module whose forward is a channel-local op followed by its child modules (timm's BatchNormAct2d:
    batch norm, then ``drop`` and ``act``): channel-local when every child has a local or view rule."""

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        for name, child in module.named_children():
            rule = module_rule(type(child))
            if rule is None or rule.kind not in ("local", "view") or isinstance(rule, Mixing):
                b.unsupported(node, f"has a child '{name}' ({type(child).__name__}) that is not a channel-local op")
        super().infer(b, node, module)


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


class Mixing(Rule):
    """An op whose output channels read many input channels through a weight.

    The weight is seen as an [out, in] connection matrix (groups give a block
    diagonal); :meth:`to_oi` and :meth:`from_oi` convert between the weight's
    layout and that matrix. Rules and kernels see the op through a :class:`WeightView`.
    """

    kind = "mixing"

    def weight_view(self, node: fx.Node, gm: fx.GraphModule) -> WeightView:
        """The module and parameter names that hold this op's weight and bias."""
        return WeightView(gm.get_submodule(node.target), node.target)

    def param_nodes(self, node: fx.Node) -> list[fx.Node]:
        """Graph nodes that are this op's weight or bias (``get_attr``), not feature tensors."""
        return []

    def structure(self, module: nn.Module) -> tuple[int, int, int]:
        """(out channels, in channels, groups)."""
        raise NotImplementedError

    def out_cdim(self, b: Builder, node: fx.Node, x: fx.Node) -> int:
        return 1

    def macs_per_connection(self, b: Builder, node: fx.Node, x: fx.Node, module: nn.Module) -> int:
        raise NotImplementedError

    def to_oi(self, module: nn.Module, w: Tensor) -> Tensor:
        """A weight-shaped tensor reduced (summed) to the [out, in] connection matrix."""
        raise NotImplementedError

    def from_oi(self, module: nn.Module, m: Tensor) -> Tensor:
        """An [out, in] matrix expanded to the weight's shape."""
        raise NotImplementedError

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        ins = tensor_args(node, b)
        if len(ins) != 1:
            b.unsupported(node, "mixing op with other than one feature-tensor input")
        x = ins[0]
        o, i, g = self.structure(module)
        if len(b.atoms[x]) != i:
            b.unsupported(node, f"expects {i} input channels along dim {b.cdim[x]}, got {b.shape(x)}")
        cdim = self.out_cdim(b, node, x)
        if i // g == 1 and not b.replicated(x):  # depthwise: output channel o reads input o // (o/g)
            b.set(node, b.atoms[x][np.arange(o) // (o // g)], cdim)
        else:
            b.set(node, b.new_atoms(o), cdim)

    def _group_cols(self, o: int, i: int, g: int) -> Tensor:
        """[o, i/g] index of the input channel each weight column reads."""
        return (torch.arange(o) // (o // g))[:, None] * (i // g) + torch.arange(i // g)[None, :]


class ConvRule(Mixing):
    forward_names = ("forward", "_conv_forward")
    def structure(self, m: nn.Module) -> tuple[int, int, int]:
        return m.out_channels, m.in_channels, m.groups

    def macs_per_connection(self, b: Builder, node: fx.Node, x: fx.Node, m: nn.Module) -> int:
        return math.prod(m.kernel_size) * math.prod(b.shape(node)[2:]) * b.shape(node)[0]

    def to_oi(self, m: nn.Module, w: Tensor) -> Tensor:
        o, i, g = self.structure(m)
        red = w.reshape(o, i // g, -1).sum(-1)
        if g == 1:
            return red
        return torch.zeros(o, i, dtype=w.dtype, device=w.device).scatter_(1, self._group_cols(o, i, g), red)

    def from_oi(self, m: nn.Module, mat: Tensor) -> Tensor:
        o, i, g = self.structure(m)
        cols = mat if g == 1 else mat.gather(1, self._group_cols(o, i, g).to(mat.device))
        return cols.reshape(o, i // g, *([1] * len(m.kernel_size))).expand_as(m.weight)


class ConvSameRule(ConvRule):
    """A convolution whose padding is computed in its forward from the input size, TensorFlow's "same"
    padding (timm's ``Conv2dSame``): the kernel pads each node's input the same way, then convolves."""


class ConvTransposeRule(ConvRule):
    """Weight [in, out/groups, k...]: entry (i, o') connects input i to output g(i)*out/g + o'."""

    def macs_per_connection(self, b: Builder, node: fx.Node, x: fx.Node, m: nn.Module) -> int:
        return math.prod(m.kernel_size) * math.prod(b.shape(x)[2:]) * b.shape(x)[0]

    def _rows(self, m: nn.Module) -> Tensor:
        o, i, g = self.structure(m)
        return (torch.arange(i) // (i // g))[:, None] * (o // g) + torch.arange(o // g)[None, :]

    def to_oi(self, m: nn.Module, w: Tensor) -> Tensor:
        o, i, g = self.structure(m)
        red = w.reshape(i, o // g, -1).sum(-1)  # [i, o/g]
        out = torch.zeros(o, i, dtype=w.dtype, device=w.device)
        out[self._rows(m).to(w.device), torch.arange(i, device=w.device)[:, None]] = red
        return out

    def from_oi(self, m: nn.Module, mat: Tensor) -> Tensor:
        o, i, g = self.structure(m)
        sel = mat[self._rows(m).to(mat.device), torch.arange(i, device=mat.device)[:, None]]  # [i, o/g]
        return sel.reshape(i, o // g, *([1] * len(m.kernel_size))).expand_as(m.weight)


class LinearRule(Mixing):
    """Linear over the last dim (B x F features, or B x T x D tokens)."""

    def structure(self, m: nn.Module) -> tuple[int, int, int]:
        o, i = m.weight.shape
        return o, i, 1

    def out_cdim(self, b: Builder, node: fx.Node, x: fx.Node) -> int:
        if b.cdim[x] != len(b.shape(x)) - 1:
            b.unsupported(node, "Linear applied to a tensor whose channel dim is not the last")
        return b.cdim[x]

    def macs_per_connection(self, b: Builder, node: fx.Node, x: fx.Node, m: nn.Module) -> int:
        return math.prod(b.shape(x)[:-1])

    def to_oi(self, m: nn.Module, w: Tensor) -> Tensor:
        return w

    def from_oi(self, m: nn.Module, mat: Tensor) -> Tensor:
        return mat


class FunctionalLinearRule(LinearRule):
    """``F.linear(x, W, b)`` on parameters of a module (``get_attr`` nodes), e.g. the fused
    input projection of ``nn.MultiheadAttention`` (``in_proj_weight``, ``in_proj_bias``)."""

    def param_nodes(self, node: fx.Node) -> list[fx.Node]:
        out = [arg(node, 1, "weight", None), arg(node, 2, "bias", None)]
        return [a for a in out if isinstance(a, fx.Node)]

    def weight_view(self, node: fx.Node, gm: fx.GraphModule) -> WeightView:
        w, b = arg(node, 1, "weight", None), arg(node, 2, "bias", None)
        if not isinstance(w, fx.Node) or w.op != "get_attr" or not isinstance(b, fx.Node | None) or (
                b is not None and b.op != "get_attr"):
            raise unsupported(node, gm, "computes its weight or bias in the graph; "
                                        "F.linear is supported on module parameters only")
        path, param = w.target.rpartition(".")[::2]
        bias_name = None
        if b is not None:
            b_path, bias_name = b.target.rpartition(".")[::2]
            if b_path != path:
                raise unsupported(node, gm, "takes its weight and bias from different modules")
        return WeightView(gm.get_submodule(path), path, param, bias_name)


# ---- the registry --------------------------------------------------------------------------

register_module_rule(nn.Conv1d, nn.Conv2d, nn.Conv3d)(ConvRule())
register_module_rule(nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)(ConvTransposeRule())
register_module_rule(nn.Linear, "timm.layers.linear.Linear")(LinearRule())
register_function_rule(F.linear)(FunctionalLinearRule())
register_module_rule(nn.modules.batchnorm._BatchNorm)(Local(flops=2))
register_module_rule(
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.SiLU, nn.GELU, nn.Hardswish, nn.Hardsigmoid, nn.Sigmoid, nn.Tanh,
    nn.ELU, nn.Hardtanh, nn.Mish, nn.Softplus, nn.PReLU,
)(Local(flops=1))
register_module_rule(
    nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.Upsample,
)(Local())
register_module_rule(nn.PixelShuffle)(PixelShuffleRule())
register_module_rule(nn.PixelUnshuffle)(PixelUnshuffleRule())
register_module_rule(nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
                     nn.FeatureAlphaDropout)(View())
register_module_rule("torchvision.ops.stochastic_depth.StochasticDepth", "timm.layers.drop.DropPath",
                     "timm.layers.drop.DropBlock2d")(InferenceIdentity())
register_function_rule("torchvision.ops.stochastic_depth.stochastic_depth",
                       "timm.layers.drop.drop_path")(InferenceIdentity())
register_module_rule("timm.layers.conv2d_same.Conv2dSame")(ConvSameRule())
register_module_rule("timm.layers.norm_act.BatchNormAct2d")(LocalWithChildren(flops=3))
register_module_rule("timm.layers.pool2d_same.MaxPool2dSame", "timm.layers.pool2d_same.AvgPool2dSame")(Local())
register_module_rule("torchvision.models.convnext.LayerNorm2d", "timm.layers.norm.LayerNorm2d")(
    ChannelsFirstLayerNorm(flops=5))
register_module_rule(
    nn.ZeroPad1d, nn.ZeroPad2d, nn.ZeroPad3d, nn.ConstantPad1d, nn.ConstantPad2d, nn.ConstantPad3d,
    nn.ReflectionPad1d, nn.ReflectionPad2d, nn.ReflectionPad3d, nn.ReplicationPad1d, nn.ReplicationPad2d,
    nn.ReplicationPad3d, nn.CircularPad1d, nn.CircularPad2d, nn.CircularPad3d,
)(PadRule())
register_function_rule(F.pad)(PadRule())
register_function_rule(torch.chunk, torch.split)(ChunkRule())
register_method_rule("chunk", "split")(ChunkRule())
register_module_rule(nn.SyncBatchNorm)(Local(flops=2))
register_module_rule(nn.Flatten)(Flatten())

register_function_rule(
    F.relu, F.relu6, F.leaky_relu, F.silu, F.gelu, F.hardswish, F.hardsigmoid, F.sigmoid, F.tanh, F.elu,
    F.hardtanh, torch.relu, torch.sigmoid, torch.tanh, F.mish,
)(Local(flops=1))
register_function_rule(
    F.interpolate, F.adaptive_avg_pool2d, F.adaptive_max_pool2d, F.avg_pool2d, F.max_pool2d,
    F.adaptive_avg_pool1d, F.avg_pool1d, F.max_pool1d,
)(Local())
register_function_rule(
    operator.add, operator.mul, operator.sub, operator.truediv, operator.iadd, operator.imul,
    torch.add, torch.mul, torch.sub, torch.div,
)(Elementwise())
register_function_rule(torch.cat, torch.concat)(Cat())
register_function_rule(torch.flatten, torch.reshape)(Flatten())
register_function_rule(F.dropout, F.dropout2d)(View())
register_function_rule(getattr, torch._assert, fx._symbolic_trace._assert_is_none)(Static())
register_function_rule(operator.getitem)(GetItem())
register_module_rule(nn.LayerNorm, "timm.layers.norm.LayerNorm")(Reduce(flops=5))
register_function_rule(F.normalize)(L2NormRule(flops=3))
register_function_rule(torch.transpose, torch.permute)(Transpose())
register_method_rule("transpose", "permute")(Transpose())
register_method_rule("expand")(Local(flops=0))

register_method_rule("relu", "relu_", "sigmoid", "sigmoid_", "tanh", "clamp", "clamp_")(Local(flops=1))
register_method_rule("add", "add_", "mul", "mul_", "sub", "sub_", "div", "div_")(Elementwise())
register_method_rule("flatten", "view", "reshape")(Flatten())
register_method_rule("contiguous")(View())
register_method_rule("size", "dim")(Static())
register_method_rule("mean")(MeanRule())
