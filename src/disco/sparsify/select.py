"""Pick the kept links under a byte budget."""

from __future__ import annotations

import numpy as np

from ..graph import Partition

BUDGETS = ("global", "layer")


def select_links(
    part: Partition, scores: np.ndarray, ratio: float, budget: str = "global", within: np.ndarray | None = None,
) -> np.ndarray:
    """The kept set for communication ratio ``ratio`` (kept bytes / dense bytes).

    ``global``: rank every link by score per byte across all layers and fill the budget
    greedily (skipping links that no longer fit, so the achieved ratio lands just under
    the target). ``layer``: keep the top ``ratio`` share of the links of every tensor
    (rounded so that the total stays on the byte budget).
    ``within`` restricts the choice to a previous kept set (gradual pruning never regrows).
    """
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"ratio must be in [0, 1], got {ratio}")
    if budget not in BUDGETS:
        raise ValueError(f"budget must be one of {BUDGETS}, got {budget!r}")
    n = part.n_links
    scores = np.asarray(scores, dtype=np.float64)
    if scores.shape != (n,):
        raise ValueError(f"scores have shape {scores.shape}, expected ({n},)")
    cand = np.ones(n, dtype=bool) if within is None else np.asarray(within, dtype=bool).copy()
    kept = np.zeros(n, dtype=bool)
    vals = part.links.values
    if budget == "global":
        room = ratio * part.dense_values()
        order = np.argsort(-(scores / vals), kind="stable")
        order = order[cand[order]]
        cum = 0
        for k in order.tolist():
            if cum + vals[k] <= room + 1e-9:
                kept[k] = True
                cum += vals[k]
        return kept
    # per tensor floor(ratio * links), then one more link for the tensors with the largest
    # remainders while the byte budget allows: uniform per layer, and on target overall
    n_t = len(part.link_tensors)
    count = np.bincount(part.links.tensor, minlength=n_t)
    plane = np.zeros(n_t, dtype=np.int64)
    plane[part.links.tensor] = vals
    exact = ratio * count
    quota = np.floor(exact + 1e-9).astype(np.int64)
    room = ratio * part.dense_values() - (quota * plane).sum()
    for t in np.argsort(-(exact - quota), kind="stable").tolist():
        if exact[t] - quota[t] > 1e-9 and plane[t] <= room + 1e-9:
            quota[t] += 1
            room -= plane[t]
    for t in range(n_t):
        idx = np.nonzero(part.links.tensor == t)[0]
        idx = idx[cand[idx]]
        kept[idx[np.argsort(-scores[idx], kind="stable")[:quota[t]]]] = True
    return kept


def cubic_ratio(step: int, total: int, target: float) -> float:
    """Gradual pruning schedule: r goes from 1 to ``target`` along a cubic (Zhu & Gupta, 2017)."""
    frac = min(1.0, max(0.0, step / max(1, total)))
    return target + (1.0 - target) * (1.0 - frac) ** 3
