"""Views and permutations: ops that move channels without computing on them (identity, dropout, cat,
flatten and reshape, transpose, permute, indexing, pixel shuffle) and values that are not feature
tensors (sizes: static)."""

from __future__ import annotations

import math
import operator

import numpy as np
import torch
import torch.nn.functional as F
from torch import fx, nn

from ..registry import register_function_rule, register_method_rule, register_module_rule
from ..types import Builder, Rule, tensor_args
from .base import Local, Static, arg
from .heads import unbound_cdim
from .reshape import permutation, permutes_channels_only, reshape_channels
from .windows import kept_channel_dim


class _Viewing(Rule):
    """A view of its operand's channels: allocates nothing and may read channels split over dims."""

    kind = "view"
    allocates = False
    reads_split_channels = True


class View(_Viewing):
    """Identity-like ops (Identity, Dropout, contiguous): the output is the input."""

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        x = tensor_args(node, b)[0]
        if x in b.csplit:
            b.set_gather(node, x, np.arange(len(b.atoms[x])), b.cdim[x], b.csplit[x], rule=GATHER)
            return
        b.set_view(node, [(x, np.arange(len(b.atoms[x])))], b.cdim[x])


class Gather(Rule):
    """A selection or permutation of channels with no compute (channel shuffle, chunk, ``x[:, a:b]``): a
    node runs it as an index selection on its own channels. The rules that select channels hand the node
    to it: ``b.set_gather(..., rule=GATHER)``."""

    kind = "view"

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        raise NotImplementedError("set by other rules through Builder.set_gather(..., rule=GATHER)")


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
                elif other is not main and b.shape(other)[cdim] == len(b.atoms[main]) > 1:
                    b.pin(other, node, cdim)  # a class token: each node joins its own channels of it
            b.set(node, b.atoms[main], cdim)
            b.use_rule(node, _CAT_LOCAL)


_CAT_LOCAL = Local(flops=0)  # the rule a concatenation along a non-channel dim behaves by


class Flatten(_Viewing):
    """flatten / view / reshape that merges a run of dims (the only reshapes supported)."""

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        x = tensor_args(node, b)[0]
        s, t, c = b.shape(x), b.shape(node), b.cdim[x]
        n_ch = len(b.atoms[x])
        if x in b.csplit:  # channels over dims c..c+k-1: only merging exactly those back is supported
            k = len(b.csplit[x])
            if t != s[:c] + (n_ch,) + s[c + k:]:
                b.unsupported(node, f"reshapes {s} -> {t}, whose channels span dims {c}..{c + k - 1}; only "
                                    "merging those dims back into one is supported")
            b.set_gather(node, x, np.arange(n_ch), c, rule=GATHER)
            return
        kept = kept_channel_dim(s, t, c)
        if kept is not None:  # the channel dim whole, the dims around it reshaped among themselves (windows)
            b.set_view(node, [(x, np.arange(n_ch))], kept)
            return
        k = len(t) - len(s) + 1
        if k > 1 and t[:c] == s[:c] and t[c + k:] == s[c + 1:] and math.prod(t[c:c + k]) == s[c] \
                and permutes_channels_only(node, c, c + k):  # a channel shuffle: the channel dim split in k dims
            b.set_gather(node, x, np.arange(n_ch), c, tuple(t[c:c + k]), rule=GATHER)
            return
        span = _merged_span(s, t)
        if span is None:  # any other reshape (heads, unfolds): followed as data
            if not reshape_channels(b, node, x):
                b.unsupported(node, f"reshapes {s} -> {t}, whose dims do not pair up into blocks")
            return
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


class Transpose(Rule):
    """transpose / permute: the data moves, the channels do not change owner."""

    reads_split_channels = True

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        x = tensor_args(node, b)[0]
        rank, c = len(b.shape(x)), b.cdim[x]
        perm = permutation(node, rank)
        if x in b.csplit:  # a permutation of the channels: the dims they span are reordered among themselves
            sizes = b.csplit[x]
            span = list(range(c, c + len(sizes)))
            if any((d in span) != (perm[d] in span) or (d not in span and perm[d] != d) for d in range(rank)):
                b.unsupported(node, "moves a dim of a channel group to or from another dim")
            axes = [perm[d] - c for d in span]
            idx = np.arange(len(b.atoms[x])).reshape(sizes).transpose(axes).reshape(-1)
            b.set_gather(node, x, idx, c, tuple(sizes[a] for a in axes), rule=GATHER)
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
                b.set(node, b.atoms[src], unbound_cdim(x, b.cdim[src], len(b.shape(src))))
            else:
                b.set_gather(node, src, sel, b.cdim[src], rule=GATHER)
            return
        if not isinstance(x, fx.Node) or b.atoms.get(x) is None:
            Static().infer(b, node, module)
            return
        idx = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
        if idx.count(Ellipsis) == 1 and not any(i is None for i in idx):  # x[..., ::2, :]: every dim named
            k = idx.index(Ellipsis)
            idx = idx[:k] + (slice(None),) * (len(b.shape(x)) - len(idx) + 1) + idx[k + 1:]
        if any(i is Ellipsis or i is None or isinstance(i, fx.Node) for i in idx):
            b.unsupported(node, "indexes a feature tensor with ..., None or a tensor")
        c = b.cdim[x]
        if c < len(idx) and idx[c] != slice(None):
            if not isinstance(idx[c], slice) or any(i != slice(None) for k, i in enumerate(idx) if k != c):
                b.unsupported(node, "selects part of the channel dim together with other dims, or by an integer")
            b.set_gather(node, x, np.arange(len(b.atoms[x]))[idx[c]], c, rule=GATHER)
            return
        b.set(node, b.atoms[x], c - sum(isinstance(i, int) for i in idx[:c]))

    def flops_per_element(self, in_shape: tuple[int, ...] | None, out_shape: tuple[int, ...]) -> float:
        return 0.0


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


class InferenceIdentity(View):
    """Ops that are the identity at inference (stochastic depth, drop path): a view. The function form
    must have been traced with ``training=False``."""

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        if module is None and arg(node, 3, "training", True) is not False:
            b.unsupported(node, "was traced in training mode (random at every call); partition the model in "
                                "eval mode")
        super().infer(b, node, module)


register_module_rule(nn.PixelShuffle)(PixelShuffleRule())
register_module_rule(nn.PixelUnshuffle)(PixelUnshuffleRule())
register_module_rule(nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
                     nn.FeatureAlphaDropout)(View())
register_module_rule("torchvision.ops.stochastic_depth.StochasticDepth", "timm.layers.drop.DropPath",
                     "timm.layers.drop.DropBlock2d")(InferenceIdentity())
register_function_rule("torchvision.ops.stochastic_depth.stochastic_depth",
                       "timm.layers.drop.drop_path")(InferenceIdentity())
register_function_rule(torch.chunk, torch.split)(ChunkRule())
register_method_rule("chunk", "split")(ChunkRule())
register_module_rule(nn.Flatten)(Flatten())
register_function_rule(torch.cat, torch.concat)(Cat())
register_function_rule(torch.flatten, torch.reshape)(Flatten())
register_function_rule(F.dropout, F.dropout2d)(View())
register_function_rule(getattr, torch._assert, fx._symbolic_trace._assert_is_none)(Static())
register_function_rule(operator.getitem)(GetItem())
register_function_rule(torch.transpose, torch.permute, torch.swapaxes, torch.swapdims)(Transpose())
register_method_rule("transpose", "permute", "swapaxes", "swapdims")(Transpose())
register_method_rule("flatten", "view", "reshape", "reshape_as", "view_as")(Flatten())
register_method_rule("contiguous")(View())
register_method_rule("size", "dim")(Static())
