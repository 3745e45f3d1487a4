"""Image classification: CIFAR-10 and any image folder (cross-entropy, top-1/top-5, KL distillation)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from .. import distributed as D
from ..data.cifar import CifarLoader
from ..errors import RefusedError
from .registry import register_task


def _model_device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


@torch.no_grad()
def evaluate_classifier(model: nn.Module, loader: Any, topk: tuple[int, ...] = (1,),
                        amp: str | None = None) -> dict[str, float]:
    """Top-k accuracies in percent and the image count ``n``, summed over ranks under torch.distributed.

    Batches go to the model's device; ``loader`` yields this rank's share of the split.
    """
    model.eval()
    dev = _model_device(model)
    correct = [0] * len(topk)
    total = 0
    for x, y in tqdm(loader, desc="eval", leave=False, disable=not D.is_main()):
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        with D.autocast(dev, amp):
            out = model(x)
        k_max = min(max(topk), out.shape[1])
        pred = out.float().topk(k_max, 1).indices
        hit = pred == y[:, None]
        for i, k in enumerate(topk):
            correct[i] += hit[:, :k].any(1).sum().item()
        total += len(y)
    *correct_f, total_f = D.all_reduce_sum([*map(float, correct), float(total)])
    res = {f"top{k}": 100.0 * c / max(total_f, 1) for k, c in zip(topk, correct_f, strict=True)}
    return res | {"n": total_f}


class _Classification:
    temperature = 4.0
    supports_ddp = True  # loaders shard under torch.distributed; evaluate reduces over ranks

    def loss(self, out: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(out, target)

    def distill(self, out: Tensor, teacher_out: Tensor) -> Tensor:
        t = self.temperature
        return F.kl_div(F.log_softmax(out.float() / t, 1), F.log_softmax(teacher_out.float() / t, 1),
                        reduction="batchmean", log_target=True) * t * t


@register_task
class Cifar10(_Classification):
    name = "cifar10"
    input_shape = (1, 3, 32, 32)
    default_model = "cifar_resnet20"
    model_kwargs: dict[str, Any] = {"num_classes": 10}

    def loaders(
        self, data: str, batch_size: int = 128, limit: int | None = None, seed: int = 0,
    ) -> tuple[Any, Any]:
        """Shuffled, augmented training batches (order and augmentation drawn from ``seed``) and the test split;
        under torchrun each rank's share."""
        r, w = D.rank(), D.world()
        return (CifarLoader(data, "train", batch_size, train=True, limit=limit, seed=seed, rank=r, world=w),
                CifarLoader(data, "test", 500, limit=limit, rank=r, world=w))

    def evaluate(self, model: nn.Module, loader: Any) -> dict[str, float]:
        return evaluate_classifier(model, loader, (1,))


@register_task
class ImageFolderTask(_Classification):
    """Any classification data set in torchvision's ImageFolder layout (see :mod:`disco.data.imagefolder`).

    Set the image size, loader workers and cache with :meth:`configure` (the CLI does it from
    ``--image-size``/``--workers``/``--cache-dir``; a checkpoint brings its own image size).
    """

    name = "imagefolder"
    default_model = "resnet18"
    image_size = 224
    workers = min(4, os.cpu_count() or 1)
    cache: str | None = None
    amp: str | None = None
    classes: list[str] | None = None  # read from the data by loaders()

    @property
    def input_shape(self) -> tuple[int, ...]:  # type: ignore[override]
        return (1, 3, self.image_size, self.image_size)

    @property
    def model_kwargs(self) -> dict[str, Any]:  # type: ignore[override]
        return {"num_classes": len(self.classes)} if self.classes else {}

    def configure(self, image_size: int | None = None, workers: int | None = None, cache: str | None = None,
                  amp: str | None = None, classes: list[str] | None = None) -> ImageFolderTask:
        if image_size is not None:
            if image_size < 8:
                raise ValueError(f"--image-size must be at least 8, got {image_size}")
            self.image_size = image_size
        if workers is not None:
            if workers < 0:
                raise ValueError(f"--workers must be >= 0, got {workers}")
            self.workers = workers
        if cache is not None:
            self.cache = cache
        self.amp = amp
        if classes is not None:
            self.classes = list(classes)
        return self

    def loaders(
        self, data: str, batch_size: int = 64, limit: int | None = None, seed: int = 0,
    ) -> tuple[Any, Any]:
        """Training batches (order from ``seed``; crops from torch's generator, seeded by the caller) and the
        val split; under torchrun each rank's share."""
        from ..data import imagefolder as F_

        with D.main_first():  # rank 0 unpacks archives into the cache, the others reuse it
            dirs = {s: F_.split_dir(data, s, self.cache) for s in F_.SPLITS}
        classes = F_.find_classes(dirs["train"])
        val_classes = F_.find_classes(dirs["val"])
        if val_classes != classes:
            raise RefusedError(f"{Path(data)}: val classes differ from train classes "
                               f"({sorted(set(val_classes) ^ set(classes))[:5]})")
        if self.classes is not None and self.classes != classes:
            raise RefusedError(f"{data}: its classes ({len(classes)}: {classes[:3]}...) are not the ones the "
                               f"checkpoint was trained on ({len(self.classes)}: {self.classes[:3]}...)")
        self.classes = classes
        out = []
        for split, train in (("train", True), ("val", False)):
            ds = F_.SkippingImageFolder(dirs[split], classes, F_.transforms(self.image_size, train))
            idx = F_.subset_indices(ds.targets, limit)
            out.append(F_.ImageFolderLoader(ds, batch_size, train, self.workers, idx, seed=seed, rank=D.rank(),
                                            world=D.world()))
        return out[0], out[1]

    def evaluate(self, model: nn.Module, loader: Any) -> dict[str, float]:
        return evaluate_classifier(model, loader, (1, 5), amp=self.amp)

    def preprocess(self, model: nn.Module) -> dict[str, Any]:
        """What the data pipeline feeds the model (travels with the checkpoint and the export)."""
        from ..data.imagefolder import MEAN, STD

        out: dict[str, Any] = {"size": [self.image_size] * 2, "mean": list(MEAN), "std": list(STD), "scale": 255.0}
        return out | ({"labels": list(self.classes)} if self.classes else {})


def task_options(task: Any, info: dict[str, Any], input_shape: list[int] | tuple[int, ...]) -> None:
    """Configure ``task`` as the checkpoint it is loaded for was trained (image size, classes)."""
    if isinstance(task, ImageFolderTask):
        task.configure(image_size=int(input_shape[-1]), classes=info.get("classes"))
