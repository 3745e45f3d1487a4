"""DeepLabV3+ (Chen et al., ECCV 2018) from torchvision parts: an atrous ResNet encoder
(torchvision's ``Bottleneck``), torchvision's ``ASPP`` (with its image-pooling branch) and the
V3+ decoder that fuses the stride-4 features of ``layer1``.

The encoder's state-dict keys follow torchvision's ResNet (``conv1``, ``bn1``, ``layer1`` ...
``layer4``), so a local torchvision ResNet-50 state dict loads into ``backbone`` of
``deeplabv3plus_resnet50`` (see :func:`load_backbone`). Output stride 16 dilates ``layer4``;
output stride 8 dilates ``layer3`` and ``layer4`` (torchvision's ``replace_stride_with_dilation``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models.resnet import Bottleneck
from torchvision.models.segmentation.deeplabv3 import ASPP

from .registry import register_model

CAMVID_CLASSES = 11


class AtrousResNet(nn.Module):
    """A Bottleneck ResNet whose last stages trade stride for dilation; returns (layer1, layer4) features.

    ``widths`` are the bottleneck widths ("planes") of the four stages (64, 128, 256, 512 for
    ResNet-50); each stage outputs ``4 * width`` channels. ``stem`` is the width of the 7x7 conv.
    """

    def __init__(self, layers: Sequence[int] = (3, 4, 6, 3), widths: Sequence[int] = (64, 128, 256, 512),
                 stem: int = 64, output_stride: int = 16) -> None:
        super().__init__()
        if output_stride not in (8, 16):
            raise ValueError(f"output_stride must be 8 or 16, got {output_stride}")
        dilate = (False, output_stride == 8, True)  # replace_stride_with_dilation of layer2..4
        self.inplanes, self.dilation = stem, 1
        self.conv1 = nn.Conv2d(3, stem, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(stem)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(widths[0], layers[0])
        self.layer2 = self._make_layer(widths[1], layers[1], 2, dilate[0])
        self.layer3 = self._make_layer(widths[2], layers[2], 2, dilate[1])
        self.layer4 = self._make_layer(widths[3], layers[3], 2, dilate[2])
        self.low_channels, self.out_channels = widths[0] * Bottleneck.expansion, widths[3] * Bottleneck.expansion
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _make_layer(self, planes: int, blocks: int, stride: int = 1, dilate: bool = False) -> nn.Sequential:
        """torchvision's ``ResNet._make_layer`` with free widths."""
        previous = self.dilation
        if dilate:
            self.dilation *= stride
            stride = 1
        out = planes * Bottleneck.expansion
        down = None
        if stride != 1 or self.inplanes != out:
            down = nn.Sequential(nn.Conv2d(self.inplanes, out, 1, stride, bias=False), nn.BatchNorm2d(out))
        layers = [Bottleneck(self.inplanes, planes, stride, down, dilation=previous)]
        self.inplanes = out
        layers += [Bottleneck(out, planes, dilation=self.dilation) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        low = self.layer1(x)
        return low, self.layer4(self.layer3(self.layer2(low)))


class DeepLabV3Plus(nn.Module):
    """Encoder -> ASPP -> upsample to stride 4 -> concat with reduced ``layer1`` -> 3x3 convs -> classes
    -> bilinear upsampling to the input size."""

    def __init__(self, backbone: AtrousResNet, num_classes: int = CAMVID_CLASSES, aspp_channels: int = 256,
                 atrous_rates: Sequence[int] = (6, 12, 18), low_channels: int = 48,
                 decoder_channels: int = 256) -> None:
        super().__init__()
        self.backbone = backbone
        self.aspp = ASPP(backbone.out_channels, list(atrous_rates), aspp_channels)
        self.reduce = nn.Sequential(nn.Conv2d(backbone.low_channels, low_channels, 1, bias=False),
                                    nn.BatchNorm2d(low_channels), nn.ReLU(inplace=True))
        self.fuse = nn.Sequential(
            nn.Conv2d(aspp_channels + low_channels, decoder_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(decoder_channels), nn.ReLU(inplace=True),
            nn.Conv2d(decoder_channels, decoder_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(decoder_channels), nn.ReLU(inplace=True))
        self.classifier = nn.Conv2d(decoder_channels, num_classes, 1)
        for m in (*self.reduce.modules(), *self.fuse.modules()):
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        low, high = self.backbone(x)
        high = F.interpolate(self.aspp(high), size=low.shape[-2:], mode="bilinear", align_corners=False)
        y = self.classifier(self.fuse(torch.cat([high, self.reduce(low)], 1)))
        return F.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=False)


def load_backbone(model: DeepLabV3Plus, path: str | Path) -> None:
    """Initialise the encoder from a local classification state dict with torchvision ResNet keys
    (``fc.*`` and other keys that the encoder lacks are ignored; shapes must match)."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path))
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
        state = state.get("state_dict", state) if isinstance(state, dict) else state
    state = {k.removeprefix("backbone."): v for k, v in state.items()}
    own = model.backbone.state_dict()
    take = {k: v for k, v in state.items() if k in own}
    bad = [k for k, v in take.items() if v.shape != own[k].shape]
    if not take or bad:
        raise ValueError(f"{path} does not fit the encoder: {len(take)} matching keys, shape mismatches {bad[:3]}")
    model.backbone.load_state_dict(take, strict=False)


def _deeplab(layers: Sequence[int], widths: Sequence[int], stem: int, output_stride: int, num_classes: int,
             aspp: int, rates: Sequence[int], low: int, decoder: int, backbone_weights: str | None) -> DeepLabV3Plus:
    model = DeepLabV3Plus(AtrousResNet(layers, widths, stem, output_stride), num_classes, aspp, rates, low, decoder)
    if backbone_weights:
        load_backbone(model, backbone_weights)
    return model


def _rates(output_stride: int, base: Sequence[int] = (6, 12, 18)) -> tuple[int, ...]:
    return tuple(r * 16 // output_stride for r in base)  # the paper doubles the rates at output stride 8


@register_model("deeplabv3plus_resnet50", input_shape=(1, 3, 512, 512))
def deeplabv3plus_resnet50(num_classes: int = CAMVID_CLASSES, output_stride: int = 16,
                           backbone_weights: str | None = None) -> DeepLabV3Plus:
    """The full-size model: ResNet-50 encoder (3, 4, 6, 3 blocks), ASPP 256, decoder 256, low-level 48.

    ``backbone_weights``: a local torchvision ResNet-50 state dict for the encoder (no download).
    """
    return _deeplab((3, 4, 6, 3), (64, 128, 256, 512), 64, output_stride, num_classes, 256,
                    _rates(output_stride), 48, 256, backbone_weights)


@register_model("deeplabv3plus_tiny", input_shape=(1, 3, 180, 240))
def deeplabv3plus_tiny(num_classes: int = CAMVID_CLASSES, output_stride: int = 16,
                       backbone_weights: str | None = None) -> DeepLabV3Plus:
    """A CPU-sized model (trains on 2 cores): stem 16, stages (1, 2, 2, 1) blocks of widths
    (8, 16, 32, 64) -> 32..256 channels, ASPP 64 with rates 6/12/18, decoder 64, low-level 16."""
    return _deeplab((1, 2, 2, 1), (8, 16, 32, 64), 16, output_stride, num_classes, 64,
                    _rates(output_stride), 16, 64, backbone_weights)


@register_model("deeplabv3plus_test")
def deeplabv3plus_test(num_classes: int = 5, output_stride: int = 16) -> DeepLabV3Plus:
    """For tests: one block per stage, widths (4, 4, 8, 8), ASPP 16 with rates 1/2/3, decoder 16."""
    return _deeplab((1, 1, 1, 1), (4, 4, 8, 8), 8, output_stride, num_classes, 16,
                    _rates(output_stride, (1, 2, 3)), 8, 16, None)
