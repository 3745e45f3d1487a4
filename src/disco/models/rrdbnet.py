"""ESRGAN's generator, RRDBNet (Wang et al., 2018): residual-in-residual dense blocks.

Written here (about a hundred lines of standard architecture); the state-dict keys follow
the usual ``conv_first / body / conv_body / conv_up1 / conv_up2 / conv_hr / conv_last``
layout of the public ESRGAN implementations, so their checkpoints load.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .registry import register_model


class ResidualDenseBlock(nn.Module):
    """Five 3x3 convs with dense concatenations; output scaled by 0.2 and added to the input."""

    def __init__(self, nf: int = 64, gc: int = 32) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(nf, gc, 3, 1, 1)
        self.conv2 = nn.Conv2d(nf + gc, gc, 3, 1, 1)
        self.conv3 = nn.Conv2d(nf + 2 * gc, gc, 3, 1, 1)
        self.conv4 = nn.Conv2d(nf + 3 * gc, gc, 3, 1, 1)
        self.conv5 = nn.Conv2d(nf + 4 * gc, nf, 3, 1, 1)
        self.lrelu = nn.LeakyReLU(0.2, inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        x1 = self.lrelu(self.conv1(x))
        x2 = self.lrelu(self.conv2(torch.cat((x, x1), 1)))
        x3 = self.lrelu(self.conv3(torch.cat((x, x1, x2), 1)))
        x4 = self.lrelu(self.conv4(torch.cat((x, x1, x2, x3), 1)))
        x5 = self.conv5(torch.cat((x, x1, x2, x3, x4), 1))
        return x5 * 0.2 + x


class RRDB(nn.Module):
    """Three dense blocks with an outer residual, also scaled by 0.2."""

    def __init__(self, nf: int, gc: int = 32) -> None:
        super().__init__()
        self.rdb1 = ResidualDenseBlock(nf, gc)
        self.rdb2 = ResidualDenseBlock(nf, gc)
        self.rdb3 = ResidualDenseBlock(nf, gc)

    def forward(self, x: Tensor) -> Tensor:
        return self.rdb3(self.rdb2(self.rdb1(x))) * 0.2 + x


class RRDBNet(nn.Module):
    """RRDBNet for x2 or x4 super-resolution (nearest-neighbour upsampling + convs)."""

    def __init__(self, num_in_ch: int = 3, num_out_ch: int = 3, scale: int = 4, num_feat: int = 64,
                 num_block: int = 23, num_grow_ch: int = 32) -> None:
        super().__init__()
        if scale not in (2, 4):
            raise ValueError(f"scale must be 2 or 4, got {scale}")
        self.scale = scale
        self.conv_first = nn.Conv2d(num_in_ch, num_feat, 3, 1, 1)
        self.body = nn.Sequential(*[RRDB(num_feat, num_grow_ch) for _ in range(num_block)])
        self.conv_body = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_up1 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_up2 = nn.Conv2d(num_feat, num_feat, 3, 1, 1) if scale == 4 else None
        self.conv_hr = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_last = nn.Conv2d(num_feat, num_out_ch, 3, 1, 1)
        self.lrelu = nn.LeakyReLU(0.2, inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        feat = self.conv_first(x)
        feat = feat + self.conv_body(self.body(feat))
        feat = self.lrelu(self.conv_up1(F.interpolate(feat, scale_factor=2, mode="nearest")))
        if self.conv_up2 is not None:
            feat = self.lrelu(self.conv_up2(F.interpolate(feat, scale_factor=2, mode="nearest")))
        return self.conv_last(self.lrelu(self.conv_hr(feat)))


@register_model("rrdbnet", input_shape=(1, 3, 64, 64))
def rrdbnet(scale: int = 4, num_feat: int = 64, num_block: int = 23, num_grow_ch: int = 32) -> RRDBNet:
    """The full-size ESRGAN generator by default (23 blocks, 64 features, growth 32)."""
    return RRDBNet(scale=scale, num_feat=num_feat, num_block=num_block, num_grow_ch=num_grow_ch)


@register_model("rrdbnet_tiny", input_shape=(1, 3, 24, 24))
def rrdbnet_tiny(scale: int = 4, num_feat: int = 16, num_block: int = 2, num_grow_ch: int = 8) -> RRDBNet:
    """A CPU-sized RRDBNet (for training on 2 cores and for tests)."""
    return RRDBNet(scale=scale, num_feat=num_feat, num_block=num_block, num_grow_ch=num_grow_ch)
