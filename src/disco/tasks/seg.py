"""Semantic segmentation (CamVid, Cityscapes): per-pixel cross-entropy, mIoU and pixel accuracy.

Metric protocol: the model runs on the image at the task's ``base_scale`` (CamVid: 240x180);
its logits are upsampled bilinearly to the full label resolution (CamVid: 480x360) and the
argmax is compared with the label there. One confusion matrix is accumulated over the whole
split; void pixels (:data:`disco.data.seg.IGNORE`) are left out. IoU of class c =
TP / (TP + FP + FN); mIoU is the mean over the classes that occur in the labels or the
predictions (a class absent from both has no IoU); pixel accuracy = correct / labelled pixels.
Values are in percent; per-class IoU is returned as ``iou_<class>``.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from ..data.seg import IGNORE, SegEvalSet, SegTrainLoader, find_layout
from .registry import register_task

log = logging.getLogger(__name__)

CAMVID_CLASSES = ("sky", "building", "pole", "road", "pavement", "tree", "sign_symbol", "fence", "car",
                  "pedestrian", "bicyclist")
CITYSCAPES_CLASSES = ("road", "sidewalk", "building", "wall", "fence", "pole", "traffic_light", "traffic_sign",
                      "vegetation", "terrain", "sky", "person", "rider", "car", "truck", "bus", "train",
                      "motorcycle", "bicycle")


def confusion(pred: Tensor, target: Tensor, num_classes: int, ignore: int = IGNORE) -> Tensor:
    """[C, C] int64 counts, rows = label, columns = prediction; ``ignore`` labels left out."""
    keep = target != ignore
    t, p = target[keep].long(), pred[keep].long()
    if t.numel() and (int(t.max()) >= num_classes or int(t.min()) < 0):
        raise ValueError(f"labels outside 0..{num_classes - 1} (and not the ignore value {ignore})")
    return torch.bincount(t * num_classes + p, minlength=num_classes * num_classes).view(num_classes, num_classes)


def seg_metrics(conf: Tensor, names: tuple[str, ...]) -> dict[str, float]:
    """mIoU, pixel accuracy and ``iou_<name>`` (percent) from a confusion matrix (NaN IoU: class absent)."""
    conf = conf.double()
    tp = conf.diag()
    union = conf.sum(0) + conf.sum(1) - tp
    iou = torch.where(union > 0, tp / union.clamp(min=1), torch.full_like(tp, float("nan")))
    present = ~iou.isnan()
    out = {"miou": 100.0 * float(iou[present].mean()) if present.any() else 0.0,
           "pixel_acc": 100.0 * float(tp.sum() / conf.sum().clamp(min=1))}
    out.update({f"iou_{n}": 100.0 * float(v) for n, v in zip(names, iou.tolist(), strict=True)})
    return out


class Segmentation:
    """Shared implementation; subclasses fix the dataset, its classes and resolutions."""

    name = "seg"
    kind = "camvid"  # the folder layout this task reads (disco.data.seg.find_layout)
    classes: tuple[str, ...] = CAMVID_CLASSES
    eval_split = "test"
    base_scale = 0.5  # model input = image * base_scale (training crops come from around it)
    crop = (176, 224)  # (h, w) training crop at about base_scale
    scale_range = (0.75, 1.5)
    eval_batch = 8
    input_shape: tuple[int, ...] = (1, 3, 180, 240)  # the partition's shape: one evaluation input
    default_model = "deeplabv3plus_tiny"
    model_kwargs: dict[str, Any] = {"num_classes": len(CAMVID_CLASSES)}
    optimizer = "adamw"
    lr = 1e-3
    finetune_lr = 5e-4
    weight_decay = 1e-4
    temperature = 2.0  # of the per-pixel KL distillation

    def loaders(
        self, data: str, batch_size: int = 8, limit: int | None = None, seed: int = 0,
    ) -> tuple[Any, Any]:
        """Training crops (decoded on first use) and the evaluation split; ``limit`` caps the images."""
        layout = find_layout(data)
        if layout.kind != self.kind:
            raise ValueError(f"{data} is a {layout.kind} folder; task {self.name!r} reads {self.kind} "
                             f"(use --task {layout.kind})")
        n = len(self.classes)
        return (SegTrainLoader(data, n, "train", batch_size, self.crop, self.base_scale, self.scale_range, limit,
                               seed),
                SegEvalSet(data, n, self.eval_split, self.base_scale, self.eval_batch, limit))

    def loss(self, out: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(out, target, ignore_index=IGNORE)

    def distill(self, out: Tensor, teacher_out: Tensor) -> Tensor:
        """Per-pixel KL(teacher || student) at temperature T, averaged over pixels, times T^2."""
        t = self.temperature
        kl = F.kl_div(F.log_softmax(out / t, 1), F.log_softmax(teacher_out / t, 1), reduction="none",
                      log_target=True)
        return kl.sum(1).mean() * t * t

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader: Any) -> dict[str, float]:
        """mIoU, pixel accuracy, per-class IoU (percent) and ``n`` images over ``loader``'s (x, y) batches."""
        model.eval()
        c = len(self.classes)
        conf = torch.zeros(c, c, dtype=torch.int64)
        n = 0
        for x, y in tqdm(loader, desc="eval", leave=False):
            logits = model(x)
            if logits.shape[-2:] != y.shape[-2:]:
                logits = F.interpolate(logits, size=y.shape[-2:], mode="bilinear", align_corners=False)
            conf += confusion(logits.argmax(1), y, c)
            n += len(y)
        out = seg_metrics(conf, self.classes)
        log.info("%s: mIoU %.2f, pixel accuracy %.2f over %d images", self.name, out["miou"], out["pixel_acc"], n)
        return out | {"n": float(n)}


@register_task
class CamVid(Segmentation):
    """SegNet's CamVid: 11 classes (void ignored), 480x360 labels, the model at 240x180."""

    name = "camvid"


@register_task
class Cityscapes(Segmentation):
    """Cityscapes fine (``*_labelTrainIds.png``): 19 classes, 2048x1024 labels, the model at 512x256;
    evaluated on ``val`` (the test labels are not public)."""

    name = "cityscapes"
    kind = "cityscapes"
    classes = CITYSCAPES_CLASSES
    eval_split = "val"
    base_scale = 0.25
    crop = (192, 384)
    eval_batch = 4
    input_shape = (1, 3, 256, 512)
    model_kwargs: dict[str, Any] = {"num_classes": len(CITYSCAPES_CLASSES)}
