"""SSD detectors split at the head outputs: the part that runs over the nodes, and the leader's post-processing.

The registered models (``ssd300_vgg16_split``, ``ssdlite320_split``, ``ssd_tiny_split``) hold the
backbone, the extra layers and the classification and box heads. Their forward takes the
already transformed image batch (resized, normalised) and returns the raw per-level head
outputs, a flat tuple ``(cls_0, ..., cls_{L-1}, box_0, ..., box_{L-1})`` with ``anchors x
classes`` and ``anchors x 4`` channels: plain convolutions, so they split through the general
op rules. Anchor generation, reshaping, box decoding and NMS run after the gather, in
:class:`SSDPost` (built from the model's :class:`SSDSpec`).

Weights layout: the modules are torchvision's (``backbone.*``, ``head.classification_head.
module_list.*``, ``head.regression_head.module_list.*``), so a torchvision SSD / SSDlite state dict
loads as it is. One rename: VGG16-SSD's ``backbone.scale_weight`` (the L2Norm scale of conv4_3)
is held by an :class:`L2Norm` module as ``backbone.l2norm.weight``; a load hook maps the
torchvision key (see :func:`to_torchvision_state_dict` for the way back).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models.detection import ssd as tv_ssd
from torchvision.models.detection import ssdlite as tv_ssdlite
from torchvision.models.detection.anchor_utils import DefaultBoxGenerator
from torchvision.models.detection.image_list import ImageList
from torchvision.ops import Conv2dNormActivation
from torchvision.ops import boxes as box_ops

from ..graph.ops import L2NormRule
from ..graph.registry import register_module_rule
from .registry import register_model

log = logging.getLogger(__name__)



def feature_maps(blocks: tuple[nn.Module, ...], x: Tensor) -> list[Tensor]:
    """The output of every block of a chain (the feature maps an SSD head reads)."""
    out = []
    for block in blocks:
        x = block(x)
        out.append(x)
    return out

class L2Norm(nn.Module):
    """``x / ||x||_2`` over the channels times a learned per-channel scale (SSD's conv4_3 L2Norm)."""

    def __init__(self, channels: int, scale: float = 20.0, eps: float = 1e-12) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((channels,), float(scale)))
        self.eps, self.dim = eps, 1

    def forward(self, x: Tensor) -> Tensor:
        return self.weight.view(1, -1, 1, 1) * F.normalize(x, dim=1, eps=self.eps)


register_module_rule(L2Norm)(L2NormRule(flops=3))  # a channel reduction: one sum of squares per position


class VGGExtractor(nn.Module):
    """torchvision's ``SSDFeatureExtractorVGG`` (same ``features`` and ``extra``) with the L2Norm as a module."""

    def __init__(self, tv_backbone: nn.Module) -> None:
        super().__init__()
        self.features = tv_backbone.features
        self.l2norm = L2Norm(tv_backbone.scale_weight.numel())
        with torch.no_grad():
            self.l2norm.weight.copy_(tv_backbone.scale_weight)
        self.extra = tv_backbone.extra
        self._register_load_state_dict_pre_hook(_rename_scale_weight)

    def forward(self, x: Tensor) -> list[Tensor]:
        x = self.features(x)
        out = [self.l2norm(x)]
        for block in self.extra:
            x = block(x)
            out.append(x)
        return out


def _rename_scale_weight(state: dict, prefix: str, *args: Any) -> None:
    if prefix + "scale_weight" in state:
        state[prefix + "l2norm.weight"] = state.pop(prefix + "scale_weight")


def to_torchvision_state_dict(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A split model's state dict with torchvision's SSD keys (``backbone.scale_weight``)."""
    return {k.replace("backbone.l2norm.weight", "backbone.scale_weight"): v for k, v in state.items()}


class TinyBackbone(nn.Module):
    """A small CNN for CPU runs: stride-8 and stride-16 stages, then stride-2 extra blocks."""

    def __init__(self, width: int = 32, levels: int = 5) -> None:
        super().__init__()
        w = width
        cbr = Conv2dNormActivation
        self.features = nn.ModuleList([
            nn.Sequential(cbr(3, w // 2, 3, 2), cbr(w // 2, w, 3, 2), cbr(w, w, 3), cbr(w, 2 * w, 3, 2),
                          cbr(2 * w, 2 * w, 3)),  # stride 8
            nn.Sequential(cbr(2 * w, 3 * w, 3, 2), cbr(3 * w, 3 * w, 3)),  # stride 16
        ])
        self.extra = nn.ModuleList([nn.Sequential(cbr(3 * w, 3 * w // 2, 1), cbr(3 * w // 2, 3 * w, 3, 2))
                                    for _ in range(levels - 2)])
        self.out_channels = [2 * w] + [3 * w] * (levels - 1)

    def forward(self, x: Tensor) -> list[Tensor]:
        return feature_maps((*self.features, *self.extra), x)


class MobileNetExtractor(nn.Module):
    """torchvision's ``SSDLiteFeatureExtractorMobileNet`` returning a list (same submodules and keys)."""

    def __init__(self, tv_backbone: nn.Module) -> None:
        super().__init__()
        self.features, self.extra = tv_backbone.features, tv_backbone.extra

    def forward(self, x: Tensor) -> list[Tensor]:
        return feature_maps((*self.features, *self.extra), x)


@dataclass
class SSDSpec:
    """What the leader needs besides the head outputs: classes (with background) and the default boxes."""

    num_classes: int
    aspect_ratios: list[list[int]]
    min_ratio: float = 0.15
    max_ratio: float = 0.9
    scales: list[float] | None = None
    steps: list[int] | None = None
    post: dict[str, float] = field(default_factory=dict)  # score_thresh, nms_thresh, ... overrides

    def anchor_generator(self) -> DefaultBoxGenerator:
        return DefaultBoxGenerator(self.aspect_ratios, self.min_ratio, self.max_ratio, self.scales, self.steps)


class SSDSplit(nn.Module):
    """Backbone + extra layers + heads; ``forward(x)`` returns the raw head outputs (see the module doc)."""

    def __init__(self, backbone: nn.Module, head: nn.Module, spec: SSDSpec) -> None:
        super().__init__()
        self.backbone, self.head, self.spec = backbone, head, spec
        sig = tuple(_out_channels(m) for m in (*head.classification_head.module_list,
                                               *head.regression_head.module_list))
        if _SPECS.get(sig, spec) != spec:
            log.warning("two SSD models with the same head outputs %s but other default boxes: the loss and "
                        "metric of outputs without their model use the last one built", sig)
        _SPECS[sig] = spec

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        feats = self.backbone(x)
        cls = [m(f) for m, f in zip(self.head.classification_head.module_list, feats, strict=True)]
        box = [m(f) for m, f in zip(self.head.regression_head.module_list, feats, strict=True)]
        return (*cls, *box)


def _split_torchvision(tv: nn.Module, extractor: type[nn.Module], num_classes: int) -> SSDSplit:
    """A built torchvision SSD as a split model: its backbone wrapped by ``extractor``, its head, and a spec
    with its default boxes and post-processing settings (SSDlite uses its own)."""
    ag = tv.anchor_generator
    post = {k: getattr(tv, k) for k in ("score_thresh", "nms_thresh", "detections_per_img", "topk_candidates")}
    spec = SSDSpec(num_classes, ag.aspect_ratios, scales=ag.scales, steps=ag.steps, post=post)
    return SSDSplit(extractor(tv.backbone), tv.head, spec)


@register_model("ssd300_vgg16_split", input_shape=(1, 3, 300, 300))
def ssd300_vgg16_split(num_classes: int = 91) -> SSDSplit:
    """torchvision's ``ssd300_vgg16`` (random weights) as a split model; input 3x300x300 in 0-255 minus mean."""
    tv = tv_ssd.ssd300_vgg16(weights=None, weights_backbone=None, num_classes=num_classes)
    return _split_torchvision(tv, VGGExtractor, num_classes)


@register_model("ssdlite320_split", input_shape=(1, 3, 320, 320))
def ssdlite320_split(num_classes: int = 91) -> SSDSplit:
    """torchvision's ``ssdlite320_mobilenet_v3_large`` (random weights) as a split model."""
    tv = tv_ssdlite.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=num_classes)
    return _split_torchvision(tv, MobileNetExtractor, num_classes)


@register_model("ssd_tiny_split", input_shape=(1, 3, 128, 128))
def ssd_tiny_split(num_classes: int = 11, width: int = 32, levels: int = 5) -> SSDSplit:
    """A CPU-sized SSD: :class:`TinyBackbone` with torchvision's SSDlite heads (for 128x128 inputs)."""
    backbone = TinyBackbone(width, levels)
    spec = SSDSpec(num_classes, [[2, 3]] * levels, min_ratio=0.15, max_ratio=0.9)
    ag = spec.anchor_generator()
    spec.scales = ag.scales
    head = tv_ssdlite.SSDLiteHead(backbone.out_channels, ag.num_anchors_per_location(), num_classes,
                                  nn.BatchNorm2d)
    return SSDSplit(backbone, head, spec)


@register_model("ssd_small_split")
def ssd_small_split(num_classes: int = 11) -> SSDSplit:
    """:func:`ssd_tiny_split` at twice the width (64-channel stages): 32 channels per node at N=2."""
    return ssd_tiny_split(num_classes, width=64)


_SPECS: dict[tuple[int, ...], SSDSpec] = {}  # head output channels -> spec, for outputs seen without their model


def _out_channels(m: nn.Module) -> int:
    return [c for c in m.modules() if isinstance(c, nn.Conv2d)][-1].out_channels


def spec_for_outputs(outputs: tuple[Tensor, ...]) -> SSDSpec:
    """The spec of the split SSD (built in this process) whose head outputs have these channel counts."""
    sig = tuple(int(o.shape[1]) for o in outputs)
    if sig not in _SPECS:
        raise ValueError(f"no SSD split model built in this process has head outputs with channels {sig}")
    return _SPECS[sig]


def spec_of(model: nn.Module) -> SSDSpec | None:
    """The :class:`SSDSpec` of a split SSD, also through a DISCO wrapper (``.model``)."""
    for m in (model, getattr(model, "model", None)):
        if isinstance(getattr(m, "spec", None), SSDSpec):
            return m.spec
    return None


class SSDPost:
    """The leader's side: default boxes, the multibox loss and detection post-processing.

    Reuses torchvision's matcher, box coder and the loss and post-processing methods of
    ``torchvision.models.detection.SSD`` (called on this object, which has the attributes they read).
    """

    def __init__(self, spec: SSDSpec) -> None:
        self.spec = spec
        self.anchor_generator = spec.anchor_generator()
        self.box_coder = tv_ssd.det_utils.BoxCoder(weights=(10.0, 10.0, 5.0, 5.0))
        self.proposal_matcher = tv_ssd.det_utils.SSDMatcher(0.5)
        self.neg_to_pos_ratio = 3.0
        self.score_thresh, self.nms_thresh = 0.01, 0.45
        self.detections_per_img, self.topk_candidates = 200, 400
        for k, v in spec.post.items():
            setattr(self, k, v)
        self._anchors: dict[tuple, Tensor] = {}

    def split(self, outputs: tuple[Tensor, ...]) -> dict[str, Tensor]:
        """Per-level outputs -> ``cls_logits`` [B, sum HWA, K] and ``bbox_regression`` [B, sum HWA, 4]."""
        n = len(outputs) // 2
        return {"cls_logits": _flatten(outputs[:n], self.spec.num_classes),
                "bbox_regression": _flatten(outputs[n:], 4)}

    def anchors(self, outputs: tuple[Tensor, ...], image_size: tuple[int, int]) -> Tensor:
        """Default boxes [sum HWA, 4] (x1, y1, x2, y2 in input pixels) for these feature sizes (cached)."""
        n = len(outputs) // 2
        key = (tuple(tuple(o.shape[-2:]) for o in outputs[:n]), tuple(image_size))
        if key not in self._anchors:
            il = ImageList(torch.empty(1, 3, *image_size), [tuple(image_size)])
            self._anchors[key] = self.anchor_generator(il, list(outputs[:n]))[0]
        return self._anchors[key]

    def loss(self, outputs: tuple[Tensor, ...], targets: list[dict[str, Tensor]],
             image_size: tuple[int, int]) -> Tensor:
        """SSD's multibox loss (smooth L1 on matched boxes + hard-negative-mined cross-entropy)."""
        anchors = self.anchors(outputs, image_size)
        matched = []
        for t in targets:
            if t["boxes"].numel() == 0:
                matched.append(torch.full((anchors.size(0),), -1, dtype=torch.int64))
            else:
                matched.append(self.proposal_matcher(box_ops.box_iou(t["boxes"], anchors)))
        losses = tv_ssd.SSD.compute_loss(self, targets, self.split(outputs), [anchors] * len(targets), matched)
        return losses["bbox_regression"] + losses["classification"]

    @torch.no_grad()
    def detect(self, outputs: tuple[Tensor, ...], image_size: tuple[int, int]) -> list[dict[str, Tensor]]:
        """Boxes (input pixels), scores and labels per image: decode, per-class top-k, NMS."""
        anchors = self.anchors(outputs, image_size)
        b = outputs[0].shape[0]
        return tv_ssd.SSD.postprocess_detections(self, self.split(outputs), [anchors] * b, [tuple(image_size)] * b)


def _flatten(levels: tuple[Tensor, ...], k: int) -> Tensor:
    """(B, A*k, H, W) per level -> (B, sum HWA, k), in torchvision's anchor order."""
    out = []
    for t in levels:
        b, _, h, w = t.shape
        out.append(t.view(b, -1, k, h, w).permute(0, 3, 4, 1, 2).reshape(b, -1, k))
    return torch.cat(out, 1)
