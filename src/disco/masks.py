"""The DISCO model: the original architecture with block-structured masks on its mixing layers.

Masks are ``torch.nn.utils.parametrize`` parametrizations (``weight = original * mask``),
so the model trains as an ordinary PyTorch module on one device and computes exactly
the function that the distributed runtime computes.
"""

from __future__ import annotations

import logging
import re

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
            if parametrize.is_parametrized(m, ly.param):
                raise ValueError(f"layer {ly.key} is already parametrized (wrapped twice?)")
            parametrize.register_parametrization(m, ly.param, ColumnMask(torch.ones_like(getattr(m, ly.param))))
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
                view = ly.view(self.model)
                mask = view.module.parametrizations[ly.param][0].mask
                oi = torch.from_numpy(ly.connection_mask(kept)).to(mask.device, mask.dtype)
                mask.copy_(ly.rule.from_oi(view, oi))

    @property
    def ratio(self) -> float:
        return self.partition.ratio(self.kept)

    def forward(self, *args: Tensor) -> Tensor:
        return self.model(*args)

    def plain_state_dict(self) -> dict[str, Tensor]:
        """The original model's state dict with the masks applied (loadable without disco)."""
        out: dict[str, Tensor] = {}
        for k, v in self.model.state_dict().items():
            hit = _ORIGINAL.fullmatch(k)
            if hit:
                path, param = hit.groups()
                out[f"{path}.{param}"] = getattr(self.model.get_submodule(path), param).detach().clone()
            elif ".parametrizations." not in k:
                out[k] = v
        return out


_ORIGINAL = re.compile(r"(.+)\.parametrizations\.(\w+)\.original")

