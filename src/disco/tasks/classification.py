"""Image classification on CIFAR-10: cross-entropy, top-1, KL distillation."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from ..data.cifar import CifarLoader
from .registry import register_task


@register_task
class Cifar10:
    name = "cifar10"
    input_shape = (1, 3, 32, 32)
    default_model = "cifar_resnet20"
    model_kwargs: dict[str, Any] = {"num_classes": 10}
    temperature = 4.0

    def loaders(
        self, data: str, batch_size: int = 128, limit: int | None = None, seed: int = 0,
    ) -> tuple[Any, Any]:
        """Shuffled, augmented training batches (order and augmentation drawn from ``seed``) and the test split."""
        return (CifarLoader(data, "train", batch_size, train=True, limit=limit, seed=seed),
                CifarLoader(data, "test", 500, limit=limit))

    def loss(self, out: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(out, target)

    def distill(self, out: Tensor, teacher_out: Tensor) -> Tensor:
        t = self.temperature
        return F.kl_div(F.log_softmax(out / t, 1), F.log_softmax(teacher_out / t, 1),
                        reduction="batchmean", log_target=True) * t * t

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader: Any) -> dict[str, float]:
        model.eval()
        correct = total = 0
        for x, y in tqdm(loader, desc="eval", leave=False):
            correct += (model(x).argmax(1) == y).sum().item()
            total += len(y)
        return {"top1": 100.0 * correct / max(total, 1), "n": float(total)}
