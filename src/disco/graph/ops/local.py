"""Channel-local ops: activations, BatchNorm, pooling, interpolation, padding, and elementwise arithmetic
(add, mul, ... whose operands are coupled channel by channel). :class:`~disco.graph.ops.base.Local`
is the kind; this module registers the ops that behave by it."""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import fx, nn

from ..registry import module_rule, register_function_rule, register_method_rule, register_module_rule
from ..types import Builder, Rule, tensor_args
from .base import Local, arg


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
            if b.replicated(other) and shp[d] == len(b.atoms[main]):
                # a replicated tensor with one entry per channel of ``main`` (ConvNeXt's layer scale, C x 1 x 1; a
                # bias per attention head): every node holds it and reads the entries of its own channels
                b.pin(other, node, d)
            b.couple(node, main, other)
        b.set(node, b.atoms[main], cdim)


class PadRule(Local):
    """Padding of the trailing (spatial) dims (``F.pad``, ``nn.ZeroPad2d``, ``nn.ConstantPad2d``,
    reflection and replication padding): channel-local unless it pads the channel dim."""

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        x = tensor_args(node, b)[0]
        pad = module.padding if module is not None else arg(node, 1, "pad", ())
        if isinstance(pad, fx.Node):
            b.unsupported(node, "pads by amounts computed in the graph")
        pad = tuple(pad) if isinstance(pad, (tuple, list)) else (pad, pad)
        k = len(b.shape(x)) - 1 - b.cdim[x]  # pairs run from the last dim backwards: pair k pads the channels
        if 2 * k + 1 < len(pad) and (pad[2 * k], pad[2 * k + 1]) != (0, 0):
            b.unsupported(node, "pads the channel dim")
        super().infer(b, node, module)

    def flops_per_element(self, in_shape: tuple[int, ...] | None, out_shape: tuple[int, ...]) -> float:
        return 0.0


class LocalWithChildren(Local):
    """A module whose forward is a channel-local op followed by its child modules (timm's BatchNormAct2d:
    batch norm, then ``drop`` and ``act``): channel-local when every child has a local or view rule."""

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        for name, child in module.named_children():
            rule = module_rule(type(child))
            if rule is None or rule.kind not in ("local", "view"):
                b.unsupported(node, f"has a child '{name}' ({type(child).__name__}) that is not a channel-local op")
        super().infer(b, node, module)


register_module_rule(nn.modules.batchnorm._BatchNorm)(Local(flops=2))
register_module_rule(nn.SyncBatchNorm)(Local(flops=2))
register_module_rule("timm.layers.norm_act.BatchNormAct2d")(LocalWithChildren(flops=3))
register_module_rule("timm.layers.pool2d_same.MaxPool2dSame", "timm.layers.pool2d_same.AvgPool2dSame")(Local())
register_module_rule(
    nn.ZeroPad1d, nn.ZeroPad2d, nn.ZeroPad3d, nn.ConstantPad1d, nn.ConstantPad2d, nn.ConstantPad3d,
    nn.ReflectionPad1d, nn.ReflectionPad2d, nn.ReflectionPad3d, nn.ReplicationPad1d, nn.ReplicationPad2d,
    nn.ReplicationPad3d, nn.CircularPad1d, nn.CircularPad2d, nn.CircularPad3d,
)(PadRule())
register_function_rule(F.pad)(PadRule())
register_module_rule(
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.SiLU, nn.GELU, nn.Hardswish, nn.Hardsigmoid, nn.Sigmoid, nn.Tanh,
    nn.ELU, nn.Hardtanh, nn.Mish, nn.Softplus, nn.PReLU,
)(Local(flops=1))
register_module_rule(
    nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.Upsample,
)(Local())
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
register_method_rule("expand")(Local(flops=0))
register_method_rule("relu", "relu_", "sigmoid", "sigmoid_", "tanh", "clamp", "clamp_")(Local(flops=1))
register_method_rule("add", "add_", "mul", "mul_", "sub", "sub_", "div", "div_")(Elementwise())
