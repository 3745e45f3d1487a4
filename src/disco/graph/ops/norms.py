"""Norms and other reductions: LayerNorm and the L2 norm over the channel dim (kept exact by exchanging
per-position statistics), and means over non-channel dims."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from ..registry import register_function_rule, register_method_rule, register_module_rule
from ..types import REPLICATED, Builder, OpCost, Partition, Rule, shape_of, tensor_args
from .base import Local, arg


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

    def cost(self, part: Partition, node: fx.Node) -> OpCost | None:
        """The elementwise FLOPs, and the ``stats`` values per position every rank sends every other."""
        c = super().cost(part, node)
        own = part.owner[node.name]
        if c is not None and not (own == REPLICATED).all():
            n = part.nodes
            c.stats_values = self.stats * (math.prod(shape_of(node)) // len(own)) * n * (n - 1)
        return c

    def stats_shape(self, shape: tuple[int, ...], cdim: int) -> tuple[int, ...]:
        """The shape of the statistics one node sends every other (:meth:`partial`'s output): ``stats`` values
        per normalised position."""
        return (*shape[:cdim], *shape[cdim + 1:], self.stats)

    def partial(self, x: Tensor, cdim: int) -> Tensor:
        """This node's per-position statistics over its own channels, ``stats`` of them on a new last dim."""
        if x.shape[cdim]:
            mean = x.mean(cdim)
            m2 = (x - mean.unsqueeze(cdim)).pow(2).sum(cdim)
        else:
            mean = m2 = torch.zeros(x.shape[:cdim] + x.shape[cdim + 1:], dtype=x.dtype)
        return torch.stack([mean, m2], -1)

    def function_module(self, node: fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """What :meth:`finish` gets as ``module`` for a function call ``node`` from its arguments as this node
        holds them (``args``, ``kwargs``: a per-channel weight cut to its channels): None unless a rule reads
        them (``F.group_norm``'s weight and bias)."""
        return None

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
        if module is None and isinstance(dim, int) and dim % len(b.shape(x)) != b.cdim[x]:
            _NORMALIZE_LOCAL.infer(b, node, module)  # over another dim (the features of a head): channel-local
            b.use_rule(node, _NORMALIZE_LOCAL)
            return
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


_NORMALIZE_LOCAL = Local(flops=3)  # F.normalize over a dim other than the channel dim
register_module_rule(nn.LayerNorm, "timm.layers.norm.LayerNorm")(Reduce(flops=5))
register_module_rule("torchvision.models.convnext.LayerNorm2d", "timm.layers.norm.LayerNorm2d")(
    ChannelsFirstLayerNorm(flops=5))
register_function_rule(F.normalize)(L2NormRule(flops=3))
register_method_rule("mean")(MeanRule())
