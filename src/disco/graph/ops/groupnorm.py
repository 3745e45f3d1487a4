"""GroupNorm over channels split across nodes (PoolFormer's ``GroupNorm(1, C)``), as a module (``nn.GroupNorm``,
timm's) or as a function (``F.group_norm`` on a module's parameters).

* One group (``num_groups == 1``): the statistics are over a sample's channels and positions; every node
  sends the mean and M2 of its own channels (two values per sample, counted as ``stats_bytes`` like
  LayerNorm's), and every node combines them (Chan et al.) and normalises its own channels exactly.
* Several groups: the channels of a group are coupled (one owner per group, the groups aligned to node
  boundaries), so each node computes its groups' statistics alone: nothing is exchanged.

The function's weight and bias (``get_attr`` nodes) are per-channel tensors every node holds whole; the
executor hands :meth:`GroupNormRule.finish` the entries of the node's own channels
(:meth:`FunctionalGroupNormRule.function_module`), the same slices the module form's shard holds.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from ..registry import register_function_rule, register_module_rule
from ..types import REPLICATED, OpCost, shape_of, tensor_args
from .base import arg
from .norms import Reduce

if TYPE_CHECKING:
    from ..types import Builder, Partition


@dataclass(frozen=True)
class GroupNormArgs:
    """What a ``F.group_norm`` call reads, named as ``nn.GroupNorm`` names it (what the rule sees as its module)."""

    num_groups: int
    weight: Tensor | None
    bias: Tensor | None
    eps: float


class GroupNormRule(Reduce):
    """``nn.GroupNorm`` (and timm's ``GroupNorm``/``GroupNorm1``) on an N x C x ... tensor split by channels.
    ``groups_local``: the rule a node with several groups (each on one node) behaves by: nothing exchanged."""

    def __init__(self, flops: float | None = 5, groups_local: bool = False) -> None:
        super().__init__(flops)
        self.groups_local = groups_local
        self.local_groups = self if groups_local else type(self)(flops, groups_local=True)

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | GroupNormArgs | None) -> None:
        x = tensor_args(node, b)[0]
        groups, c = module.num_groups, len(b.atoms[x])
        if b.cdim[x] != 1:
            b.unsupported(node, f"normalises groups of dim 1, but the channels are dim {b.cdim[x]}")
        if groups > 1 and not b.replicated(x):  # each group on one node: its statistics are local
            per = b.atoms[x].reshape(groups, c // groups)
            for k in range(1, c // groups):
                b.couple_atoms(per[:, 0], per[:, k])
            b.use_rule(node, self.local_groups)
        b.set(node, b.atoms[x], 1)

    def cost(self, part: Partition, node: fx.Node) -> OpCost | None:
        """Elementwise FLOPs; with one group, two values per sample from every node to every other."""
        c = super().cost(part, node)
        if c is not None:
            own, n = part.owner[node.name], part.nodes
            one = self.module_of(node, part.gm).num_groups == 1 and not (own == REPLICATED).all()
            c.stats_values = self.stats * shape_of(node)[0] * n * (n - 1) if one else 0
        return c

    def stats_shape(self, shape: tuple[int, ...], cdim: int) -> tuple[int, ...]:
        """Per sample the mean and M2 ([B, 2]); with several groups (each on one node) nothing ([B, 0])."""
        return (shape[0], 0 if self.groups_local else 2)

    def partial(self, x: Tensor, cdim: int) -> Tensor:
        """Per sample: the mean and M2 over this node's channels and positions ([B, 2]); with several groups
        nothing ([B, 0])."""
        if self.groups_local:
            return x.new_zeros(x.shape[0], 0)
        if x.shape[cdim]:
            flat = x.reshape(x.shape[0], -1)
            mean = flat.mean(1)
            m2 = (flat - mean[:, None]).pow(2).sum(1)
        else:
            mean = m2 = x.new_zeros(x.shape[0])
        return torch.stack([mean, m2], -1)

    def finish(self, module: nn.Module | GroupNormArgs | None, node: fx.Node, x: Tensor, cdim: int, parts: Tensor,
               counts: Tensor) -> Tensor:
        """Several groups: GroupNorm of this node's whole groups. One group: the combined statistics.
        ``module``'s weight and bias hold this node's channels."""
        if module.num_groups > 1:  # whole groups: channels in order, group size C / G
            size = int(counts.sum()) // module.num_groups
            return F.group_norm(x, x.shape[1] // size, module.weight, module.bias, module.eps)
        plane = int(np.prod(x.shape[2:])) if x.dim() > 2 else 1
        n = counts.view(-1, 1) * plane
        total = n.sum()
        g_mean = (parts[..., 0] * n).sum(0) / total
        g_m2 = (parts[..., 1] + n * (parts[..., 0] - g_mean).pow(2)).sum(0)
        shape = [-1] + [1] * (x.dim() - 1)
        y = (x - g_mean.view(shape)) / torch.sqrt(g_m2.view(shape) / total + module.eps)
        wshape = [1, -1] + [1] * (x.dim() - 2)
        if module.weight is not None:
            y = y * module.weight.view(wshape)
        if module.bias is not None:
            y = y + module.bias.view(wshape)
        return y


class FunctionalGroupNormRule(GroupNormRule):
    """``F.group_norm(x, num_groups, weight, bias, eps)`` with a constant ``num_groups`` and the weight and
    bias parameters of a module (``get_attr`` nodes) or None: the module form's rule on its arguments."""

    def module_of(self, node: fx.Node, gm: fx.GraphModule) -> GroupNormArgs | None:
        """The call's arguments with the full weight and bias; None where :meth:`refusal` refuses it."""
        if self.refusal(node) is not None:
            return None
        return self.function_module(node, *fx.node.map_arg((node.args, node.kwargs), lambda a: _attr(gm, a)))

    @staticmethod
    def refusal(node: fx.Node) -> str | None:
        """Why the rule cannot split this call, or None."""
        if not isinstance(arg(node, 1, "num_groups", None), int):
            return "takes num_groups computed in the graph; F.group_norm is supported with a constant int only"
        if not isinstance(arg(node, 4, "eps", 1e-5), float | int):
            return "takes eps computed in the graph"
        for name, i in (("weight", 2), ("bias", 3)):
            t = arg(node, i, name, None)
            if t is not None and (not isinstance(t, fx.Node) or t.op != "get_attr"):
                return f"computes its {name} in the graph; F.group_norm is supported on module parameters only"
        return None

    def infer(self, b: Builder, node: fx.Node, module: GroupNormArgs | None) -> None:
        why = self.refusal(node)
        if why is not None:
            b.unsupported(node, why)
        super().infer(b, node, module)

    def function_module(self, node: fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> GroupNormArgs:
        """The call's arguments (``args``, ``kwargs``: ``node``'s, as a node holds them) named as the module's."""
        def get(i: int, name: str, default: Any) -> Any:
            return args[i] if len(args) > i else kwargs.get(name, default)

        return GroupNormArgs(get(1, "num_groups", None), get(2, "weight", None), get(3, "bias", None),
                             get(4, "eps", 1e-5))


def _attr(gm: fx.GraphModule, a: fx.Node) -> Any:
    """The value of a ``get_attr`` node of ``gm``; other nodes as they are."""
    return operator.attrgetter(a.target)(gm) if a.op == "get_attr" else a


register_module_rule(nn.GroupNorm, "timm.layers.norm.GroupNorm", "timm.layers.norm.GroupNorm1")(GroupNormRule())
register_function_rule(F.group_norm)(FunctionalGroupNormRule())
