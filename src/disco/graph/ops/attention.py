"""Multi-head attention: split by heads, so attention itself is local to a node.

Attention modules are *decomposed* while tracing into what DESIGN.md asks for: the
input projection (a mixing op: a Linear whose outputs are the query, key and value
channels), :func:`heads_attention` (channel-local per head: the q, k and v channels of a
head are coupled, so one node holds them all), and the output projection (a mixing op).
One received channel of the block's input serves the query, key and value projections
alike, because they are one Linear. The original module still runs in the DISCO model
(same function); only the graph sees the decomposition.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from ..errors import UnsupportedOpError
from ..registry import register_decomposition, register_function_rule
from ..tracesite import caller_site
from ..types import tensor_args
from .base import Local, arg

log = logging.getLogger(__name__)

def heads_attention(qkv: Tensor, head_dim: int, scale: float) -> Tensor:
    """Scaled dot-product attention over ``[q heads | k heads | v heads]`` channels (B x T x 3hd*h).

    Works on any number of whole heads, so a node runs it on its own heads unchanged.
    """
    b, t, c3 = qkv.shape
    h = c3 // (3 * head_dim)
    q, k, v = qkv.reshape(b, t, 3, h, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    o = F.scaled_dot_product_attention(q, k, v, scale=scale)
    return o.transpose(1, 2).reshape(b, t, h * head_dim)


torch.fx.wrap("heads_attention")


class HeadsRule(Local):
    """heads_attention: all channels of one head (its q, k, v and outputs) share one owner."""

    def infer(self, b: Any, node: fx.Node, module: nn.Module | None) -> None:
        x = tensor_args(node, b)[0]
        hd = int(arg(node, 1, "head_dim", None))
        a = b.atoms[x]
        c = len(a) // 3
        heads = c // hd
        if heads < b.ranks:
            b.unsupported(node, f"has {heads} attention heads, fewer than N={b.ranks} nodes (a head is not split; "
                                f"use N <= {heads})")
        if heads % b.ranks:  # whole heads, balanced: e.g. 6 heads over 4 nodes as 2, 2, 1, 1
            log.info("%s: %d heads over %d nodes: uneven head counts per node", node.name, heads, b.ranks)
        per_head = a.reshape(3, heads, hd).transpose(1, 0, 2).reshape(heads, 3 * hd)  # [head, its 3*hd atoms]
        for k in range(1, 3 * hd):
            b.couple_atoms(per_head[:, 0], per_head[:, k])
        b.set(node, a[:c], b.cdim[x])

    def flops_per_element(self, in_shape: tuple[int, ...] | None, out_shape: tuple[int, ...]) -> float:
        return 4.0 * out_shape[-2]  # q.k over T keys and the weighted sum of T values, per output value


register_function_rule(heads_attention)(HeadsRule())


def _require(cond: bool, m: nn.Module, what: str) -> None:
    if not cond:
        site = caller_site()
        at = f" (called at {site})" if site else ""
        raise UnsupportedOpError(f"{type(m).__name__}: {what} is not supported by the head-split attention rule{at}")


def _timm_attention(m: nn.Module, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
    _require(attn_mask is None and not is_causal, m, "an attention mask")
    for name in ("q_norm", "k_norm", "norm"):
        _require(isinstance(getattr(m, name, nn.Identity()), nn.Identity), m, f"a non-identity {name}")
    _require(getattr(m, "gate", None) is None, m, "a gate")
    qkv = m.qkv(x)
    return m.proj_drop(m.proj(heads_attention(qkv, m.head_dim, m.scale)))


try:  # timm is optional: its attention is decomposed when it is installed
    from timm.models.vision_transformer import Attention as _TimmAttention

    register_decomposition(_TimmAttention)(_timm_attention)
except ImportError:  # pragma: no cover
    pass



@register_decomposition(nn.MultiheadAttention)
def _torch_mha(m: nn.MultiheadAttention, query: Tensor, key: Tensor, value: Tensor,
               key_padding_mask: Tensor | None = None, need_weights: bool = True, attn_mask: Tensor | None = None,
               average_attn_weights: bool = True, is_causal: bool = False) -> tuple[Tensor, None]:
    """Self-attention through ``nn.MultiheadAttention`` (torchvision's ViT): the fused input
    projection is ``F.linear`` on ``in_proj_weight`` (a mixing op on a module parameter)."""
    _require(query is key and key is value, m, "attention with distinct query, key and value inputs")
    _require(key_padding_mask is None and attn_mask is None and not is_causal, m, "an attention mask")
    _require(m._qkv_same_embed_dim and m.bias_k is None and not m.add_zero_attn, m,
             "separate q/k/v projections, bias_k/bias_v or add_zero_attn")
    x = query if m.batch_first else query.transpose(0, 1)
    qkv = F.linear(x, m.in_proj_weight, m.in_proj_bias)
    o = m.out_proj(heads_attention(qkv, m.head_dim, m.head_dim ** -0.5))
    return (o if m.batch_first else o.transpose(0, 1)), None
