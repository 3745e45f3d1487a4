"""Link selection by reconstruction error (disco.sparsify.greedy): the forward selection's gains are the exact
least-squares error reductions, the shrunk covariance of a layer with few rows, the layer sensitivity, and the
scores a budget ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_pretrained import Tiny, _cut

import disco
from disco.sparsify.calibrate import reconstruct
from disco.sparsify.greedy import greedy_order, greedy_scores, layer_sensitivity, shrunk


def _lstsq_err(x: np.ndarray, y: np.ndarray, cols: np.ndarray) -> float:
    v, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
    return float(((x[:, cols] @ v - y) ** 2).sum())


def _layer(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Inputs with correlated columns (a few latent factors) and a dense layer's outputs on them."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(600, 4)) @ rng.normal(size=(4, 16)) + 0.3 * rng.normal(size=(600, 16))
    x[:, 9] = 3 * x[:, 0] + 0.05 * rng.normal(size=600)  # a remote column the local one already explains
    return x, x @ rng.normal(size=(6, 16)).T


def test_greedy_gains_are_the_exact_error_reductions() -> None:
    x, y = _layer()
    w = np.linalg.lstsq(x, y, rcond=None)[0].T
    h = x.T @ x
    local, cand = np.arange(4), np.arange(4, 16)
    order, gains = greedy_order(h, h @ w.T, local, cand, eps=0.0)
    assert sorted(order.tolist()) == cand.tolist()
    base = _lstsq_err(x, y, local)
    for k in range(1, len(cand) + 1):  # the sum of the first k gains is the error the first k columns remove
        assert base - _lstsq_err(x, y, np.concatenate([local, order[:k]])) == pytest.approx(gains[:k].sum(),
                                                                                            rel=1e-6, abs=1e-6)
    assert order[0] == min(cand, key=lambda c: _lstsq_err(x, y, np.append(local, c)))  # the best single column
    assert gains[list(order).index(9)] < 1e-2 * gains[0]  # the column the local one explains gains ~nothing


def test_greedy_subset_beats_random_subsets() -> None:
    x, y = _layer(1)
    h = x.T @ x
    w = np.linalg.lstsq(x, y, rcond=None)[0].T
    local, cand = np.arange(4), np.arange(4, 16)
    order, _ = greedy_order(h, h @ w.T, local, cand)
    rng = np.random.default_rng(0)
    for k in (2, 4):
        mine = _lstsq_err(x, y, np.concatenate([local, order[:k]]))
        others = [_lstsq_err(x, y, np.concatenate([local, rng.choice(cand, k, replace=False)])) for _ in range(20)]
        assert mine < np.percentile(others, 25)  # forward selection is not optimal, but beats most draws


def test_shrunk_covariance_keeps_each_columns_own_part() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 32))  # 8 rows, 32 columns: X^T X is singular
    h = x.T @ x
    s = shrunk(h, len(x))
    assert np.allclose(np.diag(s), np.diag(h))
    assert np.linalg.matrix_rank(s) == 32 and np.linalg.matrix_rank(h) == 8
    assert np.allclose(shrunk(h, 10**9), h, atol=1e-6)  # many rows: left as it is
    w = rng.normal(size=(4, 32))
    _, gains = greedy_order(h, h @ w.T, np.arange(16), np.arange(16, 32))
    _, gains_s = greedy_order(s, s @ w.T, np.arange(16), np.arange(16, 32))
    assert gains.max() < 1e-6 * np.trace(w @ h @ w.T) < gains_s.min()  # raw: the local half "explains" all


def test_layer_sensitivity_of_the_output_layer_is_one() -> None:
    _, dm = _cut()
    kept = dm.kept.copy()
    torch.manual_seed(0)
    s = layer_sensitivity(dm, lambda: [torch.randn(16, 3, 8, 8)])
    assert set(s) == {ly.name for ly in dm.partition.layers}
    assert s["fc"] == pytest.approx(1.0, rel=1e-4)  # the noise, rel x each logit's RMS, is the output's error
    assert all(v > 0 for v in s.values())
    assert np.array_equal(dm.kept, kept)  # the kept set is put back


@pytest.mark.parametrize("sensitivity", [True, False])
def test_greedy_selection_reconstructs_better_than_random(sensitivity: bool) -> None:
    """At the same byte budget, the greedy kept set leaves each refit layer less error than a random one."""
    torch.manual_seed(1)
    cal = [torch.randn(32, 3, 8, 8) for _ in range(4)]
    errs = {}
    for how in ("greedy", "random"):
        dense, dm = _cut(ratio=1.0)
        s = (greedy_scores(dm, lambda: cal, sensitivity=sensitivity, progress=False) if how == "greedy"
             else disco.sparsify.random_scores(dm.partition.n_links, 0))
        assert s.shape == (dm.partition.n_links,) and (s >= 0).all()
        dm.set_kept(disco.sparsify.select_links(dm.partition, s, 0.3))
        errs[how] = reconstruct(dm, dense, lambda: cal, ridge=1e-6, progress=False)
    common = set(errs["greedy"]) & set(errs["random"])
    assert common
    assert sum(errs["greedy"][n][1] for n in common) < sum(errs["random"][n][1] for n in common)


def test_greedy_refuses_layers_it_cannot_score() -> None:
    class Wide(Tiny):  # a 3x3 convolution that reads the other node's channels
        def __init__(self) -> None:
            super().__init__()
            self.pw1 = torch.nn.Conv2d(16, 32, 3, padding=1, bias=False)

    m = Wide().eval()
    dm = disco.DiscoModel(m, disco.partition(m, (1, 3, 8, 8), 2))
    with pytest.raises(ValueError, match="1x1 convolutions and linear layers only.*pw1"):
        greedy_scores(dm, lambda: [torch.randn(4, 3, 8, 8)], sensitivity=False, progress=False)
