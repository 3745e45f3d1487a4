"""Convolutions and transposed convolutions (mixing ops, grouped and depthwise included)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from ..registry import register_module_rule
from ..types import Builder
from .mixing import Mixing


class ConvRule(Mixing):
    """Conv1d/2d/3d: weight [out, in/groups, k...]; a rank runs F.conv on its blocks."""

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

    def apply(self, m: nn.Module, x: Tensor, w: Tensor, bias: Tensor | None, groups: int = 1) -> Tensor:
        fn = (F.conv1d, F.conv2d, F.conv3d)[len(m.kernel_size) - 1]
        padding = m.padding
        if m.padding_mode != "zeros":
            x = F.pad(x, m._reversed_padding_repeated_twice, mode=m.padding_mode)
            padding = 0
        return fn(x, w, bias, m.stride, padding, m.dilation, groups)


class ConvSameRule(ConvRule):
    """A convolution whose padding is computed in its forward from the input size, TensorFlow's "same"
    padding (timm's ``Conv2dSame``): the kernel pads each node's input the same way, then convolves."""

    def apply(self, m: nn.Module, x: Tensor, w: Tensor, bias: Tensor | None, groups: int = 1) -> Tensor:
        pad: list[int] = []
        for k, s, d, size in reversed(list(zip(m.kernel_size, m.stride, m.dilation, x.shape[2:], strict=True))):
            p = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
            pad += [p // 2, p - p // 2]
        return super().apply(m, F.pad(x, pad), w, bias, groups)


class ConvTransposeRule(ConvRule):
    """Weight [in, out/groups, k...]: entry (i, o') connects input i to output g(i)*out/g + o'."""

    in_major = True

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

    def apply(self, m: nn.Module, x: Tensor, w: Tensor, bias: Tensor | None, groups: int = 1) -> Tensor:
        fn = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[len(m.kernel_size) - 1]
        return fn(x, w, bias, m.stride, m.padding, m.output_padding, groups, m.dilation)


register_module_rule(nn.Conv1d, nn.Conv2d, nn.Conv3d)(ConvRule())
register_module_rule(nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)(ConvTransposeRule())
register_module_rule("timm.layers.conv2d_same.Conv2dSame")(ConvSameRule())
