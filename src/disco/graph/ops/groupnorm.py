"""GroupNorm over channels split across nodes (PoolFormer's ``GroupNorm(1, C)``).

* One group (``num_groups == 1``): the statistics are over a sample's channels and positions; every node
  sends the mean and M2 of its own channels (two values per sample, counted as ``stats_bytes`` like
  LayerNorm's), and every node combines them (Chan et al.) and normalises its own channels exactly.
* Several groups: the channels of a group are coupled (one owner per group, the groups aligned to node
  boundaries), so each node computes its groups' statistics alone: nothing is exchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from ..registry import register_module_rule
from ..types import REPLICATED, OpCost, shape_of, tensor_args
from .norms import Reduce

if TYPE_CHECKING:
    from ..types import Builder, Partition


class GroupNormRule(Reduce):
    """``nn.GroupNorm`` (and timm's ``GroupNorm``/``GroupNorm1``) on an N x C x ... tensor split by channels."""

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        x = tensor_args(node, b)[0]
        groups, c = module.num_groups, len(b.atoms[x])
        if b.cdim[x] != 1:
            b.unsupported(node, f"normalises groups of dim 1, but the channels are dim {b.cdim[x]}")
        if groups > 1 and not b.replicated(x):  # each group on one node: its statistics are local
            per = b.atoms[x].reshape(groups, c // groups)
            for k in range(1, c // groups):
                b.couple_atoms(per[:, 0], per[:, k])
            b.use_rule(node, LOCAL_GROUPS)
        b.set(node, b.atoms[x], 1)

    def cost(self, part: Partition, node: fx.Node) -> OpCost | None:
        """Elementwise FLOPs; with one group, two values per sample from every node to every other."""
        c = super().cost(part, node)
        if c is not None:
            own, n = part.owner[node.name], part.nodes
            one = part.gm.get_submodule(node.target).num_groups == 1 and not (own == REPLICATED).all()
            c.stats_values = self.stats * shape_of(node)[0] * n * (n - 1) if one else 0
        return c

    def stats_shape(self, shape: tuple[int, ...], cdim: int) -> tuple[int, ...]:
        """Per sample the mean and M2 ([B, 2]); with several groups (each on one node) nothing ([B, 0])."""
        return (shape[0], 0 if self._groups_local else 2)

    def partial(self, x: Tensor, cdim: int) -> Tensor:
        """Per sample: the mean and M2 over this node's channels and positions ([B, 2]); with several groups
        nothing ([B, 0])."""
        if self._groups_local:
            return x.new_zeros(x.shape[0], 0)
        if x.shape[cdim]:
            flat = x.reshape(x.shape[0], -1)
            mean = flat.mean(1)
            m2 = (flat - mean[:, None]).pow(2).sum(1)
        else:
            mean = m2 = x.new_zeros(x.shape[0])
        return torch.stack([mean, m2], -1)

    def finish(self, module: nn.Module | None, node: fx.Node, x: Tensor, cdim: int, parts: Tensor,
               counts: Tensor) -> Tensor:
        """Several groups: GroupNorm of this node's whole groups. One group: the combined statistics."""
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

    _groups_local = False


class _LocalGroups(GroupNormRule):
    """Several groups, each on one node: nothing to exchange (the partial is empty)."""

    _groups_local = True


LOCAL_GROUPS = _LocalGroups(flops=5)
register_module_rule(nn.GroupNorm, "timm.layers.norm.GroupNorm", "timm.layers.norm.GroupNorm1")(GroupNormRule(flops=5))
