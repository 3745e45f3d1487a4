"""Swin's window attention (timm ``WindowAttention``): heads split over the nodes, with the relative position
bias and the shifted-window mask.

The tracer decomposes the module into its ``qkv`` projection (mixing), :func:`channel_bias` (the relative position
bias of every head repeated over the head's channels: C x N x N, computed on every node from the bias table and
index, which every node holds), :func:`biased_heads_attention` (channel-local per head, like
:func:`~disco.graph.ops.attention.heads_attention`; a node reads the bias rows of its own channels) and ``proj``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from ..registry import register_decomposition, register_function_rule, register_trace_through
from .attention import HeadsRule
from .base import Local, tensor_args


def channel_bias(table: Tensor, index: Tensor, area: int, head_dim: int) -> Tensor:
    """[heads * head_dim, N, N]: head h's relative position bias (``table[index]``) for each of its channels."""
    bias = table[index.view(-1)].view(area, area, -1).permute(2, 0, 1)
    return bias.repeat_interleave(head_dim, 0)


def biased_heads_attention(qkv: Tensor, head_dim: int, scale: float, bias: Tensor, mask: Tensor | None) -> Tensor:
    """Attention over ``[q heads | k heads | v heads]`` (B' x N x 3hd*h) with a per-channel bias (one row per
    output channel, as :func:`channel_bias`) and an optional shifted-window mask (windows x N x N)."""
    b, t, c3 = qkv.shape
    h = c3 // (3 * head_dim)
    q, k, v = qkv.reshape(b, t, 3, h, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    attn_mask = bias[::head_dim].unsqueeze(0)  # [1, h, N, N]
    if mask is not None:
        nw = mask.shape[0]
        attn_mask = attn_mask + mask.view(1, nw, 1, t, t).expand(b // nw, -1, h, -1, -1).reshape(-1, h, t, t)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)
    return o.transpose(1, 2).reshape(b, t, h * head_dim)


torch.fx.wrap("channel_bias")
torch.fx.wrap("biased_heads_attention")


class ChannelBiasRule(Local):
    """:func:`channel_bias`: computed whole on every node (replicated, one row per attention channel)."""

    def infer(self, b: Any, node: fx.Node, module: nn.Module | None) -> None:
        if not all(b.replicated(a) for a in tensor_args(node, b)):
            b.unsupported(node, "computes a bias from node-owned tensors")
        b.set(node, b.replicated_atoms(b.shape(node)[0]), 0)

    def flops_per_element(self, in_shape: tuple[int, ...] | None, out_shape: tuple[int, ...]) -> float:
        return 0.0


class BiasedHeadsRule(HeadsRule):
    """:func:`biased_heads_attention`: whole heads per node; the bias (replicated, one row per channel) is read
    at the node's own channels; the mask is read whole."""

    def infer(self, b: Any, node: fx.Node, module: nn.Module | None) -> None:
        qkv, *others = tensor_args(node, b)
        for o in others:
            if not b.replicated(o):
                b.unsupported(node, "takes a node-owned bias or mask")
        super().infer(b, node, module)
        mask = node.args[4] if len(node.args) > 4 else None
        if isinstance(mask, fx.Node) and b.shape(mask)[-1] == len(b.atoms[node]):
            b.unsupported(node, "has a mask whose last dim equals the channel count (it would be read per channel)")


register_function_rule(channel_bias)(ChannelBiasRule())
register_function_rule(biased_heads_attention)(BiasedHeadsRule())


def _timm_window_attention(m: nn.Module, x: Any, mask: Any = None) -> Any:
    tracer = x.tracer
    path = tracer.path_of_module(m)
    table = tracer.create_proxy("get_attr", f"{path}.relative_position_bias_table", (), {})
    index = tracer.create_proxy("get_attr", f"{path}.relative_position_index", (), {})
    head_dim = m.qkv.out_features // (3 * m.num_heads)
    bias = channel_bias(table, index, m.window_area, head_dim)
    qkv = m.qkv(x)
    return m.proj_drop(m.proj(biased_heads_attention(qkv, head_dim, m.scale, bias, mask)))


try:  # timm is optional
    from timm.models.swin_transformer import WindowAttention as _WindowAttention

    register_decomposition(_WindowAttention)(_timm_window_attention)
except ImportError:  # pragma: no cover
    pass


# torchvision's Swin (v1) attention is one fx-wrapped function: traced through, its window partition, heads
# (reshape + permute), relative position bias and shifted-window mask meet the rules of views, heads and constants
register_trace_through("torchvision.models.swin_transformer.shifted_window_attention",
                       "torchvision.models.swin_transformer._patch_merging_pad")
