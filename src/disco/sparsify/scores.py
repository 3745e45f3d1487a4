"""Link scores: how much each link (tensor, receiving node, channel) matters.

A link's weights are every weight column it feeds on its receiving node, over all
consumers. ``magnitude`` is the L2 norm of those weights; ``taylor`` is the
first-order estimate of the loss change when they are zeroed, |sum(w * dL/dw)|,
averaged over a few batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch
from torch import Tensor

from ..graph.types import MixingLayer
from ..masks import DiscoModel


def _scatter(dm: DiscoModel, per_layer_oi: list[Tensor]) -> np.ndarray:
    """Sum [O, I] per-connection values into link scores via each layer's column links."""
    part = dm.partition
    out = np.zeros(part.n_links, dtype=np.float64)
    for ly, oi in zip(part.layers, per_layer_oi, strict=True):
        oi = oi.detach().double().cpu().numpy()
        per_node = np.zeros((part.nodes, oi.shape[1]))
        np.add.at(per_node, ly.out_owner, oi)  # [N, I]: node j's rows summed
        sel = ly.col_link >= 0
        np.add.at(out, ly.col_link[sel], per_node[sel])
    return out


def _original(dm: DiscoModel, ly: MixingLayer) -> Tensor:
    return dm.model.get_submodule(ly.name).parametrizations[ly.param].original


def magnitude_scores(dm: DiscoModel) -> np.ndarray:
    """L2 norm of the weights each link feeds (unmasked weights: a pruned link scores too)."""
    layers = dm.partition.layers
    oi = [ly.rule.to_oi(ly.view(dm.model), _original(dm, ly).pow(2)) for ly in layers]
    return np.sqrt(_scatter(dm, oi))


def taylor_scores(
    dm: DiscoModel, batches: Iterable[tuple[Tensor, Tensor]], loss_fn: Callable[[Tensor, Tensor], Tensor],
    max_batches: int = 8,
) -> np.ndarray:
    """|sum over a link's weights of w * dL/dw|, averaged over up to ``max_batches`` batches."""
    layers = dm.partition.layers
    total = np.zeros(dm.partition.n_links)
    was_training = dm.training
    dm.eval()
    n = 0
    for x, y in batches:
        dm.zero_grad(set_to_none=True)
        loss_fn(dm(x), y).backward()
        oi = []
        for ly in layers:
            w = _original(dm, ly)
            g = w.grad if w.grad is not None else torch.zeros_like(w)
            oi.append(ly.rule.to_oi(ly.view(dm.model), (w * g).detach()))
        total += np.abs(_scatter(dm, oi))
        n += 1
        if n >= max_batches:
            break
    dm.zero_grad(set_to_none=True)
    dm.train(was_training)
    return total / max(n, 1)


def random_scores(n_links: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(n_links)
