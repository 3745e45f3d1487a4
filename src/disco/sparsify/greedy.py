"""Link selection by reconstruction error: greedy forward selection on calibration covariances.

For a mixing layer and a receiving node j, the rows it computes there are Y_j = X W_j^T (dense inputs X,
dense weights). With the node's local columns L always read, keeping the remote columns S leaves the least-
squares error

    E(S) = min_V ||X_{L+S} V^T - X W_j^T||^2,

the error :func:`~disco.sparsify.calibrate.reconstruct` then fits away as far as it can. Forward selection
(orthogonal matching pursuit over columns, as ThiNet and the channel-pruning LASSO of He et al. 2017 choose
channels by reconstruction) adds, step after step, the remote column whose addition lowers E the most: with
the covariance H = X^T X and the cross term G = H W_j^T residualised on the columns already in,

    gain(c) = ||G_c||^2 / H_cc,   then H -= H_:c H_c: / H_cc,  G -= H_:c G_c / H_cc.

A link's score is its gain when it was added, as a share of the layer's output energy ||X W^T||^2 (the
relative squared output error), times the layer's sensitivity (:func:`layer_sensitivity`: the error one unit
of it makes at the network's output), made non-increasing along each node's order: the global budget (score
per byte) then keeps a prefix of every order, and spends its bytes where they remove the most output error.
Without the sensitivity, a residual block's update (a small part of the stream) weighs as much as a block
without a skip, and the budget goes to the wrong layers: on EfficientNet-Lite0 N=2 r=0.2 (seed 0, after the
reconstruction) 12.9% top-1 on the 1000-class sample without it, 39.7% with it, 36.1% with
:func:`~disco.sparsify.calibrate.activation_scores`. Every quantity comes from one pass of the uncut network
over the calibration photos; a layer with fewer rows than columns uses a covariance shrunk toward its
diagonal (:func:`shrunk`).
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch import Tensor, nn
from tqdm import tqdm

from ..masks import DiscoModel
from .calibrate import Batches, _rows, uncut
from .scores import _original

log = logging.getLogger(__name__)


@torch.no_grad()
def input_covariances(dm: DiscoModel, batches: Batches) -> dict[str, tuple[Tensor, int]]:
    """(H = X^T X, rows of X) (float64, + a ones column for a layer with a bias) of every 1x1 convolution and
    linear layer of ``dm``, on its uncut inputs over ``batches`` (the masks are lifted while it measures)."""
    part = dm.partition
    cov: dict[str, tuple[Tensor, int]] = {}

    def hook(name: str, m: nn.Module):  # noqa: ANN202
        def f(_m: nn.Module, args: tuple[Tensor, ...]) -> None:
            x = _rows(m, args[0].detach(), m.bias is not None)
            if x is not None:
                h, n = cov.get(name, (0, 0))
                cov[name] = (x.T @ x + h, n + len(x))
        return f

    hooks = [dm.model.get_submodule(ly.name).register_forward_pre_hook(hook(ly.name, dm.model.get_submodule(
        ly.name))) for ly in part.layers]
    try:
        with uncut(dm):
            for x in batches():
                dm(x)
    finally:
        for h in hooks:
            h.remove()
    return cov


def greedy_order(h: np.ndarray, g: np.ndarray, local: np.ndarray, cand: np.ndarray, eps: float = 1e-6
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Forward selection of the columns ``cand`` (indices into ``h``) given the columns ``local`` already in.

    ``h``: [I, I] input covariance; ``g``: [I, O] cross term H W^T. Returns (the candidates in the order they
    are added, the error each removed when added). ``eps``: a ridge relative to the mean diagonal, so that
    colinear columns stay finite (they gain ~0)."""
    cols = np.concatenate([local, cand]).astype(np.int64)
    s = h[np.ix_(cols, cols)].astype(np.float64).copy()
    r = g[cols].astype(np.float64).copy()
    s[np.diag_indices_from(s)] += eps * max(float(np.mean(np.diag(s))), 1e-30)
    nl = len(local)
    if nl:  # residualise every column on the local ones at once
        k = np.linalg.solve(s[:nl, :nl], s[:nl, :]).T  # [A, L]
        s = s - k @ s[:nl, :]
        r = r - k @ r[:nl]
    s, r = s[nl:, nl:], r[nl:]
    order = np.empty(len(cand), dtype=np.int64)
    gains = np.empty(len(cand))
    live = np.ones(len(cand), dtype=bool)
    for step in range(len(cand)):
        d = np.diag(s).copy()
        gain = np.where(live & (d > 0), (r * r).sum(1) / np.where(d > 0, d, 1.0), -np.inf)
        c = int(np.argmax(gain))
        order[step], gains[step] = c, max(float(gain[c]), 0.0)
        live[c] = False
        if d[c] <= 0:
            continue
        col = s[:, c].copy()
        s -= np.outer(col, col) / d[c]
        r -= np.outer(col, r[c]) / d[c]
    return cand[order], gains


def shrunk(h: np.ndarray, n: int) -> np.ndarray:
    """H shrunk toward its diagonal by p / (p + n) for p columns and n rows: with few rows (a classifier after
    global pooling sees one row per photo, fewer than its channels) H is singular, and the columns a node
    holds would seem to explain every other column exactly; the shrunk H keeps each column's own part."""
    a = h.shape[0] / (h.shape[0] + max(n, 1))
    return (1 - a) * h + a * np.diag(np.diag(h))


@torch.no_grad()
def layer_sensitivity(dm: DiscoModel, batches: Batches, rel: float = 0.1, max_batches: int = 2, seed: int = 0
                      ) -> dict[str, float]:
    """How much the network's output moves per unit of relative squared error in each mixing layer's output.

    The error is the one a cut makes, a linear function of the layer's inputs: the layer applied with random
    Gaussian weights, each output channel scaled to ``rel`` x that channel's RMS, added to that layer alone
    (uncut network); the score is ||dy||^2 / ||y||^2 at the network's output over rel^2. A layer whose output
    is the residual stream's small update scores low; a block without a skip, or the classifier, ~1 or more.
    (Independent noise per position would be averaged away by pooling and smoothing that a cut's spatially
    coherent error is not.)"""
    part = dm.partition
    xs = [x for _, x in zip(range(max_batches), batches(), strict=False)]
    gen = torch.Generator().manual_seed(seed)

    busy = []

    def noisy(m: nn.Module, args: tuple[Tensor, ...], y: Tensor) -> Tensor | None:
        if busy:  # the call below, with the random weights
            return None
        busy.append(1)
        try:  # the module's own forward (its padding and all); every link is kept, so the mask is all ones
            d = torch.func.functional_call(m, params, args)  # params: this layer's, set below
        finally:
            busy.clear()
        dims = [i for i in range(y.dim()) if i != (1 if y.dim() == 4 else y.dim() - 1)]
        scale = y.pow(2).mean(dims, keepdim=True).sqrt() / d.pow(2).mean(dims, keepdim=True).sqrt().clamp_min(1e-30)
        return y + rel * scale * d

    with uncut(dm):
        clean = [dm(x) for x in xs]
        ref = max(sum(float(c.pow(2).sum()) for c in clean), 1e-30)
        out: dict[str, float] = {}
        for ly in part.layers:
            m = dm.model.get_submodule(ly.name)
            if not isinstance(m, nn.Conv2d | nn.Linear):
                continue
            w = dict(m.named_parameters())
            key = "parametrizations.weight.original" if "parametrizations.weight.original" in w else "weight"
            params = {key: torch.randn(w[key].shape, generator=gen, dtype=w[key].dtype).to(w[key].device),
                      **({"bias": torch.zeros_like(m.bias)} if m.bias is not None else {})}
            h = m.register_forward_hook(noisy)
            try:
                num = sum(float((dm(x) - c).pow(2).sum()) for x, c in zip(xs, clean, strict=True))
            finally:
                h.remove()
            out[ly.name] = num / ref / rel ** 2
    return out


def greedy_scores(dm: DiscoModel, batches: Batches, sensitivity: bool = True, progress: bool = True
                  ) -> np.ndarray:
    """Every link's score by greedy reconstruction (see the module doc). Layers that are not 1x1 convolutions
    or linear layers cannot be scored this way: if one of them has links, this refuses. ``sensitivity``: each
    layer's gains also weighted by :func:`layer_sensitivity` (the output error one unit of the layer's relative
    error makes), so the budget goes where it removes the most error at the network's output."""
    part = dm.partition
    sens = layer_sensitivity(dm, batches) if sensitivity else {}
    cov = input_covariances(dm, batches)
    bad = [ly.name for ly in part.layers if (ly.col_link >= 0).any() and (ly.name not in cov or ly.groups != 1)]
    if bad:
        raise ValueError(f"greedy link selection scores 1x1 convolutions and linear layers only; these layers "
                         f"have links: {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''} (use activation)")
    scores = np.zeros(part.n_links)
    for ly in tqdm(part.layers, desc="greedy scores", leave=False, disable=not progress or None):
        if not (ly.col_link >= 0).any():
            continue
        h, n = cov[ly.name]
        h = shrunk(h.numpy(), n)
        w = _original(dm, ly).detach().double()
        w = w.reshape(w.shape[0], -1).numpy()  # [O, I]
        bias = dm.model.get_submodule(ly.name).bias
        if bias is not None:  # H has a ones column (input_covariances); a bias is always local
            w = np.concatenate([w, bias.detach().double().numpy()[:, None]], 1)
        energy = max(float(np.einsum("oi,ij,oj->", w, h, w)), 1e-30)
        for j in range(part.nodes):
            rows = np.nonzero(ly.out_owner == j)[0]
            if not len(rows):
                continue
            cl = ly.col_link[j]
            local = np.nonzero(cl == ly.LOCAL)[0]
            cand = np.nonzero(cl >= 0)[0]
            if bias is not None:
                local = np.append(local, w.shape[1] - 1)
            if not len(cand):
                continue
            order, gains = greedy_order(h, h @ w[rows].T, local, cand)
            gains = np.minimum.accumulate(gains) / energy * sens.get(ly.name, 1.0)  # non-increasing: prefixes
            np.add.at(scores, cl[order], gains)
    return scores
