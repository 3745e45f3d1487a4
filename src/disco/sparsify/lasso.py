"""Group lasso over links: an optimisation-based link selection.

Each link l = (tensor t, receiving node j, channel c) owns a group of weights W_l: every weight
column that reads channel c on node j, over every mixing consumer of t (the weights that become
zero when the link is dropped). The penalty

    P(W) = lam * sum_l alpha_l * ||W_l||_2,    alpha_l = bytes_l / mean(bytes)

is the group lasso of Yuan & Lin (2006) with each group weighted by the bytes its link moves, the
convex relaxation of the byte budget sum_l bytes_l * [W_l != 0]: training with it drives whole
links to exactly zero, the expensive ones first, while the loss keeps the links it needs (Wen et
al. 2016, structured sparsity learning; Alvarez & Salzmann 2016). It is applied as a proximal step
after each optimiser step (group soft-thresholding, exact zeros); the budget then keeps the links
with the largest group norm per byte, and fine-tuning continues on the kept set.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..masks import DiscoModel
from .scores import _original


class GroupLasso:
    """The byte-weighted group lasso over the links of ``dm`` (see the module docstring)."""

    def __init__(self, dm: DiscoModel, weights: np.ndarray | None = None) -> None:
        """``weights``: what each link's group is charged (default: its bytes), scaled to mean 1 as ``alpha``."""
        self.dm = dm
        part = dm.partition
        w = part.links.values if weights is None else weights
        w = np.asarray(w, dtype=np.float64)
        if w.shape != (part.n_links,) or (w < 0).any():
            raise ValueError(f"lasso weights must be {part.n_links} non-negative numbers, got shape {w.shape}")
        self.alpha = w / w.mean() if len(w) and w.mean() > 0 else w
        # per layer: the link id of every [out, in] connection (-1: none, a local or unread column)
        self.index = [torch.from_numpy(np.maximum(ly.col_link[ly.out_owner], -1)) for ly in part.layers]

    def _sq_norms(self, grad: bool) -> Tensor:
        """Squared group norm of every link (float64, differentiable when ``grad``)."""
        part = self.dm.partition
        out = torch.zeros(part.n_links, dtype=torch.float64)
        for ly, idx in zip(part.layers, self.index, strict=True):
            w = _original(self.dm, ly)
            w = w if grad else w.detach()
            oi = ly.rule.to_oi(ly.view(self.dm.model), w.double().pow(2)).cpu()
            sel = idx >= 0
            out = out.index_add(0, idx[sel], oi[sel])
        return out

    def norms(self) -> np.ndarray:
        """||W_l||_2 for every link (a pruned link's weights count too: they are the unmasked ones)."""
        return self._sq_norms(False).sqrt().numpy()

    def penalty(self, lam: float) -> Tensor:
        """``lam * sum_l alpha_l ||W_l||``, differentiable (for a penalty term in the loss)."""
        sq = self._sq_norms(True)
        safe = torch.where(sq > 0, sq, torch.ones_like(sq)).sqrt() * (sq > 0)
        return lam * (torch.from_numpy(self.alpha) * safe).sum()

    @torch.no_grad()
    def prox(self, step: float, links: np.ndarray | None = None) -> int:
        """One proximal step of size ``step`` (= learning rate * lam): W_l <- W_l * max(0, 1 - step*alpha_l/||W_l||).

        Only the links in ``links`` (bool over link ids; default all) shrink. Returns how many groups became zero.
        """
        norms = self.norms()
        thresh = step * self.alpha
        on = np.ones(len(norms), dtype=bool) if links is None else np.asarray(links, dtype=bool)
        factor = np.ones(len(norms))
        live = on & (norms > 0)
        factor[live] = np.maximum(0.0, 1.0 - thresh[live] / norms[live])
        f = torch.from_numpy(factor)
        for ly, idx in zip(self.dm.partition.layers, self.index, strict=True):
            w = _original(self.dm, ly)
            f_oi = torch.where(idx >= 0, f[idx.clamp(min=0)], torch.ones((), dtype=torch.float64))
            w.mul_(ly.rule.from_oi(ly.view(self.dm.model), f_oi.to(w.dtype).to(w.device)))
        return int((live & (factor == 0)).sum())
