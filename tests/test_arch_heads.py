"""Heads written as view/reshape + permute, followed as data (issue 43 item 2): small hand-written attention
modules in both layouts (heads first after a channels-last Linear; channels first after a 1x1 convolution), with
the q/k/v split by ``split``, ``unbind``, indexing and ``chunk``, products by ``@``, ``einsum`` and
``F.scaled_dot_product_attention``, a bias per head indexed from a table, and channel (cross-covariance)
attention. DESIGN.md's invariants 1-4 at N=2 and N=3 are the first tests of every rule; a head is never split
over two nodes; a product that contracts the channel dim is refused."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from reference import check_invariants, rel_err
from torch import nn

from disco.graph import UnsupportedOpError, partition
from disco.masks import DiscoModel


class LevitLike(nn.Module):
    """Channels last; per head [q | k | v] (view + split along the head's features), a bias per head indexed from
    a table by a buffer, ``@`` products (LeViT, EfficientFormer's last stage)."""

    def __init__(self, c: int = 16, heads: int = 6, kd: int = 4, d: int = 6, res: int = 3) -> None:
        super().__init__()
        self.h, self.kd, self.d = heads, kd, d
        self.stem = nn.Conv2d(3, c, 2, stride=2)
        self.qkv = nn.Linear(c, heads * (2 * kd + d))
        self.proj = nn.Linear(heads * d, c)
        self.biases = nn.Parameter(torch.randn(heads, res * res))
        pts = list(itertools.product(range(res), range(res)))
        idx = [[abs(a[0] - b[0]) * res + abs(a[1] - b[1]) for b in pts] for a in pts]
        self.register_buffer("idx", torch.tensor(idx))
        self.head = nn.Linear(c, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x).flatten(2).transpose(1, 2)  # B, N, C
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, self.h, -1).split([self.kd, self.kd, self.d], dim=3)
        q, k, v = q.permute(0, 2, 1, 3), k.permute(0, 2, 3, 1), v.permute(0, 2, 1, 3)
        attn = (q @ k * self.kd ** -0.5 + self.biases[:, self.idx]).softmax(dim=-1)
        x = x + self.proj((attn @ v).transpose(1, 2).reshape(b, n, self.h * self.d))
        return self.head(x.mean(1))


class TimmLike(nn.Module):
    """Channels last; [q heads | k heads | v heads] reshaped to (3, h, d), permuted and unbound (CoaT, Swin,
    timm's Attention written out), ``F.scaled_dot_product_attention``."""

    def __init__(self, c: int = 18, heads: int = 6, by: str = "unbind") -> None:
        super().__init__()
        self.h, self.by = heads, by
        self.stem = nn.Conv2d(3, c, 2, stride=2)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.head = nn.Linear(c, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x).flatten(2).transpose(1, 2)
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.h, c // self.h).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0) if self.by == "unbind" else (qkv[0], qkv[1], qkv[2])
        o = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(o.transpose(1, 2).reshape(b, n, c))
        return self.head(x.mean(1))


class MaxvitLike(nn.Module):
    """Channels last in windows (B, G, P, D): q, k, v by ``chunk``, heads by reshape + permute, ``einsum``, a
    relative position bias per head (MaxViT)."""

    def __init__(self, c: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.h = heads
        self.stem = nn.Conv2d(3, c, 2, stride=2)
        self.qkv = nn.Linear(c, 3 * c)
        self.merge = nn.Linear(c, c)
        self.bias = nn.Parameter(torch.randn(1, heads, 4, 4))
        self.head = nn.Linear(c, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)  # B, C, 4, 4
        b, c, hh, ww = x.shape
        x = x.view(b, c, 2, 2, 2, 2).permute(0, 2, 4, 3, 5, 1).reshape(b, 4, 4, c)  # B, G windows, P, D
        q, k, v = torch.chunk(self.qkv(x), 3, dim=-1)
        q, k, v = (t.reshape(b, 4, 4, self.h, c // self.h).permute(0, 1, 3, 2, 4) for t in (q, k, v))
        attn = F.softmax(torch.einsum("bghid,bghjd->bghij", q, k) + self.bias, dim=-1)
        out = torch.einsum("bghij,bghjd->bghid", attn, v).permute(0, 1, 3, 2, 4).reshape(b, 4, 4, c)
        return self.head((x + self.merge(out)).mean((1, 2)))


class ConvHeads(nn.Module):
    """Channels first: 1x1 convolutions, heads by reshape of (B, C, H, W) to (B, h, d, HW), products in both
    orders, the output viewed back to (B, C, H, W) (EfficientFormer's Attention4D, LeViT's conv mode)."""

    def __init__(self, c: int = 12, heads: int = 6, d: int = 4) -> None:
        super().__init__()
        self.h, self.d = heads, d
        self.stem = nn.Conv2d(3, c, 2, stride=2)
        self.q, self.k, self.v = (nn.Conv2d(c, heads * d, 1) for _ in range(3))
        self.proj = nn.Conv2d(heads * d, c, 1)
        self.head = nn.Linear(c, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        b, _, hh, ww = x.shape
        q, k, v = (m(x).reshape(b, self.h, self.d, hh * ww) for m in (self.q, self.k, self.v))
        attn = (q.transpose(-2, -1) @ k).softmax(dim=-1)
        y = (v @ attn.transpose(-2, -1)).view(b, self.h * self.d, hh, ww)
        return self.head((x + self.proj(y)).mean((2, 3)))


class ChannelAttention(nn.Module):
    """Cross-covariance attention (EdgeNeXt's XCA): heads by reshape (3, h, d) + permute putting the tokens last,
    ``F.normalize`` over the tokens, a per-head temperature, attention among the channels of each head."""

    def __init__(self, c: int = 18, heads: int = 3) -> None:
        super().__init__()
        self.h = heads
        self.stem = nn.Conv2d(3, c, 2, stride=2)
        self.qkv = nn.Linear(c, 3 * c)
        self.temperature = nn.Parameter(torch.rand(heads, 1, 1) + 0.5)
        self.proj = nn.Linear(c, c)
        self.head = nn.Linear(c, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x).flatten(2).transpose(1, 2)
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.h, c // self.h).permute(2, 0, 3, 4, 1).unbind(0)
        attn = (F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)) * self.temperature
        y = (attn.softmax(dim=-1) @ v).permute(0, 3, 1, 2).reshape(b, n, c)
        return self.head((x + self.proj(y)).mean(1))


MODELS = {"levit": LevitLike, "timm_unbind": lambda: TimmLike(by="unbind"), "timm_index": lambda: TimmLike(by="index"),
          "maxvit": MaxvitLike, "conv_heads": ConvHeads, "xca": ChannelAttention}


@pytest.mark.parametrize("nodes", [2, 3])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_invariant1_all_links_equals_the_model(name: str, nodes: int) -> None:
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    x = torch.randn(1, 3, 8, 8) if name != "levit" else torch.randn(1, 3, 6, 6)
    part = partition(model, x, nodes)
    with torch.no_grad():
        assert rel_err(DiscoModel(model, part).eval()(x), model(x)) < 1e-5


@pytest.mark.parametrize("nodes", [2, 3])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_invariants_2_to_4(name: str, nodes: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8, 8) if name != "levit" else torch.randn(1, 3, 6, 6)
    check_invariants(MODELS[name]().eval(), x, nodes)


def test_a_head_is_never_split_over_nodes() -> None:
    """q, k and v of one head, and its output channels, have one owner; heads are balanced over the nodes."""
    model = TimmLike().eval()
    part = partition(model, (1, 3, 8, 8), 3)
    own = part.layer("qkv").out_owner.reshape(3, 6, 3)  # [q | k | v] x heads x head dim
    assert (own == own[:1, :, :1]).all()  # the same owner across q/k/v and within the head
    assert np.bincount(own[0, :, 0], minlength=3).tolist() == [2, 2, 2]


class ContractsChannels(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.c(x)  # B, N, C (channels last)
        return y @ y.transpose(-2, -1)  # mixes every channel: a mixing op without a weight


def test_a_product_over_the_channel_dim_is_refused() -> None:
    with pytest.raises(UnsupportedOpError, match="contracts the channel dim"):
        partition(ContractsChannels().eval(), (1, 4, 8), 2)
