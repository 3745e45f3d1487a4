"""Object detection with split SSD models: multibox loss, COCO mAP (pycocotools), distillation on head outputs.

The model returns raw per-level head outputs; the leader's post-processing (default boxes, decoding,
NMS: :class:`disco.models.ssd.SSDPost`) runs here, and its time is reported (``post_ms`` per image).
Metric: COCO mAP@[.5:.95] (``map``) and mAP@.5 (``map50``), in percent, from ``COCOeval`` on the
original image coordinates (detections are scaled back from the resized input).
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from ..data.det import CocoDet, DetLoader, generated_folder
from ..models.ssd import SSDPost, spec_for_outputs, spec_of
from .registry import register_task

log = logging.getLogger(__name__)


class Detection:
    """Shared implementation; subclasses fix the data, the input size and the default model."""

    name = "det"
    size = 128
    input_shape: tuple[int, ...] = (1, 3, 128, 128)
    default_model = "ssd_tiny_split"
    model_kwargs: dict[str, Any] = {"num_classes": 11}
    optimizer = "adamw"
    lr = 2e-3
    # N=2 r=0.1 Taylor, 10 epochs on the generated set: 1e-4 22.6, 2e-4 25.9, 1e-3 32.4 mAP
    # (recipes/det/lr_sweep.py); a low rate keeps an every-link-kept control closer to dense but cannot adapt
    finetune_lr = 1e-3
    weight_decay = 0.05

    def __init__(self) -> None:
        self._posts: dict[int, SSDPost] = {}

    def folder(self, data: str) -> str:
        """The COCO folder behind ``--data``."""
        return data

    def loaders(
        self, data: str, batch_size: int = 32, limit: int | None = None, seed: int = 0,
    ) -> tuple[Any, Any]:
        folder = self.folder(data)
        train = CocoDet(folder, "train", self.size, limit=limit)
        test = CocoDet(folder, "test", self.size, limit=limit)
        return DetLoader(train, batch_size, train=True, seed=seed), DetLoader(test, min(batch_size, 32))

    def post(self, outputs: tuple[Tensor, ...], model: nn.Module | None = None) -> SSDPost:
        """The post-processing for a model (its spec), or for outputs seen without it (by their channels)."""
        spec = (spec_of(model) if model is not None else None) or spec_for_outputs(outputs)
        if id(spec) not in self._posts:
            self._posts[id(spec)] = SSDPost(spec)
        return self._posts[id(spec)]

    def loss(self, out: tuple[Tensor, ...], target: list[dict[str, Tensor]]) -> Tensor:
        return self.post(out).loss(out, target, (self.size, self.size))

    def distill(self, out: tuple[Tensor, ...], teacher_out: tuple[Tensor, ...]) -> Tensor:
        """KL divergence of the class distributions per default box + smooth L1 between box outputs."""
        post = self.post(out)
        s, t = post.split(out), post.split(teacher_out)
        k = s["cls_logits"].shape[-1]
        kl = F.kl_div(F.log_softmax(s["cls_logits"].reshape(-1, k), 1),
                      F.log_softmax(t["cls_logits"].reshape(-1, k), 1), reduction="batchmean", log_target=True)
        return kl + F.smooth_l1_loss(s["bbox_regression"], t["bbox_regression"])

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader: Any) -> dict[str, float]:
        """COCO mAP of ``model`` on ``loader``'s batches, with the model and post-processing times."""
        model.eval()
        dets, gts, t_model, t_post, n = [], [], 0.0, 0.0, 0
        for x, targets in tqdm(loader, desc="eval", leave=False):
            t0 = time.perf_counter()
            out = model(x)
            t1 = time.perf_counter()
            res = self.post(out, model).detect(out, tuple(x.shape[-2:]))
            t_post += time.perf_counter() - t1
            t_model += t1 - t0
            for r, t in zip(res, targets, strict=True):
                dets.append(to_original(r, t, tuple(x.shape[-2:])))
                gts.append(t)
            n += len(targets)
        out = coco_map(gts, dets)
        out.update({"n": float(n), "model_ms": 1e3 * t_model / max(n, 1), "post_ms": 1e3 * t_post / max(n, 1)})
        log.info("%s: mAP %.2f, mAP50 %.2f on %d images (post-processing %.2f ms/image)", self.name, out["map"],
                 out["map50"], n, out["post_ms"])
        return out


def to_original(det: dict[str, Tensor], target: dict[str, Tensor], size: tuple[int, int]) -> dict[str, Tensor]:
    """Detections in input pixels -> the original image's pixels (x1, y1, x2, y2)."""
    h, w = target["orig_size"].tolist()
    scale = torch.tensor([w / size[1], h / size[0], w / size[1], h / size[0]])
    return {"boxes": det["boxes"] * scale, "scores": det["scores"], "labels": det["labels"]}


def coco_map(targets: list[dict[str, Tensor]], dets: list[dict[str, Tensor]]) -> dict[str, float]:
    """COCO mAP@[.5:.95] and mAP@.5 (percent) with pycocotools' COCOeval, ground truth from the targets."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    images, anns, results = [], [], []
    labels: set[int] = set()
    for t, d in zip(targets, dets, strict=True):
        iid = int(t["image_id"])
        h, w = t["orig_size"].tolist()
        images.append({"id": iid, "height": h, "width": w})
        for b, lab, c, a in zip(t["gt_boxes"].tolist(), t["gt_labels"].tolist(), t["gt_crowd"].tolist(),
                                t["gt_area"].tolist(), strict=True):
            anns.append({"id": len(anns) + 1, "image_id": iid, "category_id": lab, "bbox": b, "area": a,
                         "iscrowd": c})
            labels.add(lab)
        for b, s, lab in zip(d["boxes"].tolist(), d["scores"].tolist(), d["labels"].tolist(), strict=True):
            results.append({"image_id": iid, "category_id": lab, "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]],
                            "score": s})
    if not results or not anns:
        return {"map": 0.0, "map50": 0.0}
    gt = COCO()
    gt.dataset = {"images": images, "annotations": anns,
                  "categories": [{"id": c} for c in sorted(labels | {r["category_id"] for r in results})]}
    with contextlib.redirect_stdout(io.StringIO()) as buf:
        gt.createIndex()
        ev = COCOeval(gt, gt.loadRes(results), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    log.debug("COCOeval:\n%s", buf.getvalue())
    return {"map": 100.0 * float(ev.stats[0]), "map50": 100.0 * float(ev.stats[1])}


@register_task
class DetGenerated(Detection):
    """CIFAR-10 objects on Imagenette backgrounds (128x128). ``--data``: the folder holding ``cifar10/`` and
    ``imagenette224/`` (the set is generated into the cache), or an already generated COCO folder."""

    name = "det_generated"

    def folder(self, data: str) -> str:
        from pathlib import Path

        p = Path(data)
        if (p / "annotations" / "instances_test.json").is_file():
            return data
        return str(generated_folder(p))


@register_task
class DetCoco128(Detection):
    """COCO-format folder (coco128, or a COCO 2017 folder: train2017 / val2017), 80 classes, SSDlite at 320."""

    name = "det_coco128"
    size = 320
    input_shape = (1, 3, 320, 320)
    default_model = "ssdlite320_split"
    model_kwargs: dict[str, Any] = {"num_classes": 81}


@register_task
class DetCoco(DetCoco128):
    """A standard COCO 2017 folder (train2017, val2017, annotations/instances_{train,val}2017.json)."""

    name = "det_coco"
