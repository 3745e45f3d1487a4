"""Window partition and reverse (Swin, MaxViT) and shifted windows: reshapes and rolls that leave the
channel dim alone.

A reshape that keeps the channel dim whole and reshapes only the dims before it among themselves and the
dims after it among themselves (B x H x W x C -> B x H/w x w x W/w x w x C and back) moves every value
within its own channel: in row-major order an element's channel is the same before and after. A rank runs
it on its own channels (the channel dim's size replaced by its count). ``torch.roll`` over dims other than
the channel dim (Swin's shifted windows) is channel-local.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import fx, nn

from ..registry import register_function_rule, register_method_rule
from .base import Local, arg, tensor_args

if TYPE_CHECKING:
    from ..types import Builder


def kept_channel_dim(s: tuple[int, ...], t: tuple[int, ...], c: int) -> int | None:
    """The dim of ``t`` that is dim ``c`` of ``s`` when reshaping ``s`` to ``t`` keeps that dim whole and
    reshapes the dims before it and after it separately; else None."""
    pre, post = math.prod(s[:c]), math.prod(s[c + 1:])
    for d, size in enumerate(t):
        if size == s[c] and math.prod(t[:d]) == pre and math.prod(t[d + 1:]) == post:
            return d
    return None


class Roll(Local):
    """``torch.roll`` / ``x.roll`` over dims other than the channel dim: channel-local."""

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        x = tensor_args(node, b)[0]
        dims = arg(node, 2, "dims", None)
        rank = len(b.shape(x))
        if dims is None:
            b.unsupported(node, "rolls the flattened tensor, across channels")
        dims = [dims] if isinstance(dims, int) else list(dims)
        if any(isinstance(d, fx.Node) for d in dims) or b.cdim[x] in [int(d) % rank for d in dims]:
            b.unsupported(node, "rolls along the channel dim")
        super().infer(b, node, module)

    def flops_per_element(self, in_shape: tuple[int, ...] | None, out_shape: tuple[int, ...]) -> float:
        return 0.0


register_function_rule(torch.roll)(Roll())
register_method_rule("roll")(Roll())
