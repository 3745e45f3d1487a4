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
    the target). ``layer``: keep the top ``ratio`` share of the links of every tensor.
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
    for t in range(len(part.link_tensors)):
        idx = np.nonzero(part.links.tensor == t)[0]
        quota = int(round(ratio * len(idx)))
        idx = idx[cand[idx]]
        kept[idx[np.argsort(-scores[idx], kind="stable")[:quota]]] = True
    return kept


def cubic_ratio(step: int, total: int, target: float) -> float:
    """Gradual pruning schedule: r goes from 1 to ``target`` along a cubic (Zhu & Gupta, 2017)."""
    frac = min(1.0, max(0.0, step / max(1, total)))
    return target + (1.0 - target) * (1.0 - frac) ** 3
