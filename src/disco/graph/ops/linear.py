"""Linear layers: ``nn.Linear`` and ``F.linear`` on module parameters (a mixing op over the last dim)."""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, fx, nn

from ..errors import unsupported
from ..registry import register_function_rule, register_module_rule
from ..types import Builder, WeightView
from .base import arg
from .mixing import Mixing
from .tokens import TOKEN_MIXING, mixes_tokens


class LinearRule(Mixing):
    """Linear over the last dim (B x F features, or B x T x D tokens)."""

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        if mixes_tokens(b, node):  # over a non-channel dim (token mixing): channel-local
            TOKEN_MIXING.infer(b, node, module)
            b.use_rule(node, TOKEN_MIXING)
            return
        super().infer(b, node, module)

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

    def apply(self, m: nn.Module, x: Tensor, w: Tensor, bias: Tensor | None, groups: int = 1) -> Tensor:
        return F.linear(x, w, bias)


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


register_module_rule(nn.Linear, "timm.layers.linear.Linear")(LinearRule())
register_function_rule(F.linear)(FunctionalLinearRule())
