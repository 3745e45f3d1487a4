"""The shared op kinds and helpers of the rules: :class:`Local` (channel-local unary ops), :class:`Static`
(values that are not feature tensors) and :func:`arg`. The base class :class:`~disco.graph.types.Rule`, its
kinds, and what a rule sees (:class:`~disco.graph.types.Builder`) live in :mod:`disco.graph.types`.

An op kind owns everything about its kind:

* ``infer``: how channel ownership flows through the op (the partitioner never looks at an op's
  type itself: it asks the op);
* ``cost``: its FLOPs per rank (and, for channel reductions, the statistics the ranks exchange);
* ``slice_param``: how a parameter of its module is cut to one rank's channels (the shard);
* mixing ops (:class:`~disco.graph.ops.mixing.Mixing`) add their weight layout, the kernel a rank
  runs on its weight blocks, and their weights per rank.
"""

from __future__ import annotations

from typing import Any

from torch import fx, nn

from ..types import Builder, Rule, tensor_args


def arg(node: fx.Node, i: int, name: str, default: Any) -> Any:
    """Argument ``i`` of a call node, or its keyword ``name``, or ``default``."""
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


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
