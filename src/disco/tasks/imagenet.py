"""An ImageNet-pretrained 1000-way classifier scored on real photos, with the guard against collapse.

Metrics (:func:`imagenet_metrics`), all in percent:

- ``top1_inette``: 1000-way top-1 on Imagenette's 2000 val photos (through each class's ImageNet-1k index);
- ``top1_sample1000`` / ``top5_sample1000``: on the 1000-class sample (one photo per class);
- ``agree_inette`` / ``agree_sample1000``: top-1 agreement with a reference network (the dense one);
- ``share_in_train_classes_sample1000``: the share of the sample's photos predicted as one of the ten
  Imagenette classes, the classes a fine-tuning on Imagenette photos can collapse onto (10 of the 1000
  photos are of those classes: a network that keeps its knowledge scores about 1%).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm

from ..data.imagenet import EVAL_SETS, IMAGENETTE_CLASSES, Photos, load_eval, normalize
from ..errors import RefusedError
from .classification import _Classification
from .registry import register_task

log = logging.getLogger(__name__)


@torch.no_grad()
def predict(model: nn.Module, photos: Photos, preprocess: dict[str, Any], batch_size: int = 50,
            desc: str = "eval") -> Tensor:
    """The model's top-5 class indices [N, 5] on ``photos`` (uint8, resized to ``preprocess["size"]``)."""
    model.eval()
    size = tuple(preprocess["size"])
    out = []
    for i in tqdm(range(0, len(photos), batch_size), desc=desc, leave=False, disable=None):
        x = normalize(photos.images[i:i + batch_size], preprocess["mean"], preprocess["std"])
        if tuple(x.shape[-2:]) != size:
            x = nn.functional.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)
        # channels-last: the depthwise convolutions of mobile networks run about 1.6x faster on the CPU
        out.append(model(x.contiguous(memory_format=torch.channels_last)).float().topk(5, 1).indices)
    return torch.cat(out)


def share_in(pred: Tensor, classes: tuple[int, ...] = IMAGENETTE_CLASSES) -> float:
    """Percent of top-1 predictions that fall in ``classes``."""
    return 100.0 * float(torch.isin(pred[:, 0], torch.tensor(classes)).float().mean())


def imagenet_metrics(preds: dict[str, Tensor], sets: dict[str, Photos],
                     reference: dict[str, Tensor] | None = None) -> dict[str, float]:
    """The metrics of the module doc from top-5 predictions per set (``reference``: the dense network's)."""
    out: dict[str, float] = {}
    for name, p in preds.items():
        y = sets[name].labels
        out[f"top1_{name}"] = 100.0 * float((p[:, 0] == y).float().mean())
        if name == "sample1000":
            out["top5_sample1000"] = 100.0 * float((p == y[:, None]).any(1).float().mean())
            out["share_in_train_classes_sample1000"] = share_in(p)
        if reference is not None and name in reference:
            out[f"agree_{name}"] = 100.0 * float((p[:, 0] == reference[name][:, 0]).float().mean())
    return out


class EvalSets:
    """Both evaluation sets, the 'loader' of the ``imagenet1k`` task."""

    def __init__(self, root: str, limit: int | None = None) -> None:
        self.sets = {n: load_eval(root, n) for n in EVAL_SETS}
        if limit is not None:
            self.sets = {n: p.subset(range(min(limit, len(p)))) for n, p in self.sets.items()}


@register_task
class ImageNet1k(_Classification):
    """A 1000-way ImageNet classifier (e.g. ``tf_efficientnet_lite0`` with ``--weights``) scored on the shared
    photos; ``data`` is the folder holding ``imagenette224`` and ``imagenet_sample1000`` (../shared/data).

    It has no labelled training set: make a checkpoint with ``disco train --task imagenet1k --weights FILE
    --epochs 0`` and fine-tune it with ``recipes/pretrained`` (calibration and distillation on unlabelled photos).
    """

    name = "imagenet1k"
    default_model = "tf_efficientnet_lite0"
    model_kwargs: dict[str, Any] = {}
    image_size = 224
    supports_ddp = False

    @property
    def input_shape(self) -> tuple[int, ...]:  # type: ignore[override]
        return (1, 3, self.image_size, self.image_size)

    def configure(self, image_size: int | None = None, **_: Any) -> ImageNet1k:
        if image_size is not None:
            self.image_size = image_size
        return self

    def loaders(self, data: str, batch_size: int = 50, limit: int | None = None, seed: int = 0
                ) -> tuple[Any, Any]:
        return _NoTraining(), EvalSets(data, limit)

    def preprocess(self, model: nn.Module) -> dict[str, Any]:
        from ..models import preprocess_of

        return preprocess_of(model, 1000, self.image_size)

    def evaluate(self, model: nn.Module, loader: Any, preprocess: dict[str, Any] | None = None) -> dict[str, float]:
        pre = preprocess or self.preprocess(model)
        preds = {n: predict(model, p, pre, desc=n) for n, p in loader.sets.items()}
        return imagenet_metrics(preds, loader.sets)


class _NoTraining:
    """The ``imagenet1k`` task's training 'loader': there is no labelled training set."""

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Any:
        raise RefusedError("task imagenet1k has no labelled training photos: use --epochs 0 with --weights, then "
                           "recipes/pretrained to calibrate and distil on unlabelled photos")
