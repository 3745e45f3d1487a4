"""The DISCO model: the original architecture with block-structured masks on its mixing layers.

Masks are ``torch.nn.utils.parametrize`` parametrizations (``weight = original * mask``),
so the model trains as an ordinary PyTorch module on one device and computes exactly
the function that the distributed runtime computes.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from .graph import Partition

log = logging.getLogger(__name__)


class ColumnMask(nn.Module):
    """Parametrization ``w -> w * mask`` (the mask is a buffer, saved with the model)."""

    def __init__(self, mask: Tensor) -> None:
        super().__init__()
        self.register_buffer("mask", mask)

    def forward(self, w: Tensor) -> Tensor:
        return w * self.mask


class DiscoModel(nn.Module):
    """Wraps ``model`` (in place) with the masks that ``partition`` and ``kept`` define.

    ``kept`` is a boolean array over ``partition``'s links; None keeps every link
    (then the model equals the original one).
    """

    def __init__(self, model: nn.Module, partition: Partition, kept: np.ndarray | None = None) -> None:
        super().__init__()
        self.model = model
        self.partition = partition
        for ly in partition.layers:
            m = model.get_submodule(ly.name)
            if parametrize.is_parametrized(m, "weight"):
                raise ValueError(f"layer {ly.name} is already parametrized (wrapped twice?)")
            parametrize.register_parametrization(m, "weight", ColumnMask(torch.ones_like(m.weight)))
        self.kept = partition.all_links()
        self.set_kept(partition.all_links() if kept is None else kept)

    def set_kept(self, kept: np.ndarray) -> None:
        """Use the links in ``kept`` (bool over link ids): recompute every mask."""
        kept = np.asarray(kept, dtype=bool)
        if kept.shape != (self.partition.n_links,):
            raise ValueError(f"kept has shape {kept.shape}, expected ({self.partition.n_links},)")
        self.kept = kept.copy()
        with torch.no_grad():
            for ly in self.partition.layers:
                m = self.model.get_submodule(ly.name)
                mask = m.parametrizations.weight[0].mask
                oi = torch.from_numpy(ly.connection_mask(kept)).to(mask.device, mask.dtype)
                mask.copy_(ly.rule.from_oi(m, oi))

    @property
    def ratio(self) -> float:
        return self.partition.ratio(self.kept)

    def forward(self, *args: Tensor) -> Tensor:
        return self.model(*args)

    def plain_state_dict(self) -> dict[str, Tensor]:
        """The original model's state dict with the masks applied (loadable without disco)."""
        out: dict[str, Tensor] = {}
        for k, v in self.model.state_dict().items():
            if ".parametrizations.weight.original" in k:
                path = k.replace(".parametrizations.weight.original", "")
                out[path + ".weight"] = self.model.get_submodule(path).weight.detach().clone()
            elif ".parametrizations.weight." not in k:
                out[k] = v
        return out

