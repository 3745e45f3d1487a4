"""The base of every op kind: what the partitioner, the cost model and the node plans ask of an op.

An op kind is a small stateless object registered (:mod:`disco.graph.registry`) for module types,
functions or method names. It owns everything about its kind:

* ``infer``: how channel ownership flows through the op (the partitioner never looks at an op's
  type itself: it asks the op);
* ``cost``: its FLOPs per rank (and, for channel reductions, the statistics the ranks exchange);
* ``slice_param``: how a parameter of its module is cut to one rank's channels (the shard);
* mixing ops (:class:`~disco.graph.ops.mixing.Mixing`) add their weight layout, the kernel a rank
  runs on its weight blocks, and their weights per rank.

Kinds (``kind``):

* ``local``   channel-local compute (BatchNorm, activations, pooling, add, mul, ...):
  each output channel is computed from the same channel of the inputs, so output
  ownership follows input ownership; operands of add/mul are *coupled* (unified).
* ``reduce``  a channel reduction kept exact by exchanging per-position statistics (LayerNorm).
* ``view``    no compute and no new link (cat, flatten, identity, dropout): every
  output channel *is* a channel of an input, given as an index map.
* ``mixing``  output channels read many input channels (Conv2d, ConvTranspose2d,
  Linear): output channels get a fresh balanced ownership; the weight columns that
  cross ranks are the links, and the ones the kept set drops are masked.
* ``static``  values that are not feature tensors (``x.size(0)``): computed on every rank.

Words: an fx *node* is one op of the captured graph; a *rank* is one machine (0..N-1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import Tensor, fx, nn

from ..capture import shape_of

if TYPE_CHECKING:
    from ..partition import Builder, Partition

REPLICATED = -1  # owner of a channel that every rank holds (the input image)


def local_index(owner: np.ndarray, rank: int) -> np.ndarray:
    """The channels ``rank`` holds of a tensor with owners ``owner``: its own and the replicated ones."""
    return np.nonzero((owner == rank) | (owner == REPLICATED))[0]


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


@dataclass
class OpCost:
    """What one op costs for one input: FLOPs per rank and on one device, statistics values exchanged."""

    flops: np.ndarray  # [N] int64
    flops_dense: int
    stats_values: int = 0
    params: np.ndarray | None = None  # [N] weights per rank (mixing layers; others: Rule.shard_tensor)


class Rule:
    """Base op kind. Subclasses set ``kind`` and implement :meth:`infer`."""

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
