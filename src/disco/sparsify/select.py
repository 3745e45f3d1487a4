"""Pick the kept links under a byte budget (and, for the joint budget, caps on FLOPs and weights per node)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ..graph import Partition

log = logging.getLogger(__name__)

BUDGETS = ("global", "layer", "joint")
# the paper's ResNet-50, N=2 profile: 5x less traffic, about half the compute, under a third of the weights per node
DEFAULT_MAX_FLOPS = 0.55
DEFAULT_MAX_WEIGHTS_PER_NODE = 0.30


@dataclass
class LinkCosts:
    """What keeping each link costs, beyond its bytes: parallel arrays over link ids.

    ``flops``: FLOPs it adds on its receiving node (2 x MACs of every weight column it feeds there);
    ``weights``: weight entries it adds to its receiving node's shard; ``exchange``: the message it
    travels in (one per tensor, sender and receiver); ``flops_floor`` / ``weights_floor``: total FLOPs and
    weights per node with no link kept (separated branches), so that cost(kept) = floor + sum over kept.
    """

    flops: np.ndarray
    weights: np.ndarray
    exchange: np.ndarray
    flops_floor: int
    flops_dense: int
    weights_floor: np.ndarray
    params_dense: int


def link_costs(part: Partition) -> LinkCosts:
    """Per-link FLOPs, weights and exchange id, and the cost floor at r = 0 (the cost model's accounting)."""
    from ..cost import estimate, link_exchanges

    n = part.n_links
    flops = np.zeros(n, dtype=np.int64)
    weights = np.zeros(n, dtype=np.int64)
    for ly in part.layers:  # each mixing op says what its connections cost (its own block walk)
        f, w = ly.rule.link_cost(ly, ly.view(part.gm), n)
        flops += f
        weights += w
    floor = estimate(part, part.no_links())
    return LinkCosts(flops, weights, link_exchanges(part), floor.flops_total, floor.flops_dense,
                     np.asarray(floor.params_per_node, dtype=np.int64), floor.params_dense)


def select_links(
    part: Partition, scores: np.ndarray, ratio: float, budget: str = "global", within: np.ndarray | None = None,
    *, max_flops: float = DEFAULT_MAX_FLOPS, max_weights_per_node: float = DEFAULT_MAX_WEIGHTS_PER_NODE,
    costs: LinkCosts | None = None, latency_weight: float = 0.0,
) -> np.ndarray:
    """The kept set for communication ratio ``ratio`` (kept bytes / dense bytes).

    ``global``: rank every link by score per byte across all layers and fill the budget
    greedily (skipping links that no longer fit, so the achieved ratio lands just under
    the target). ``layer``: keep the top ``ratio`` share of the links of every tensor
    (rounded so that the total stays on the byte budget). ``joint``: the byte budget plus
    total FLOPs <= ``max_flops`` x dense and weights of every node <= ``max_weights_per_node``
    x the whole model's. Links are ranked by score, less a price times the FLOPs and weights they
    bring to their receiving node (as shares of the room the caps leave above the r = 0 floor), per
    byte, and filled greedily under all three caps; the price is the smallest at which the byte
    budget fills (a Lagrangian relaxation of the two caps). Caps below the floor are refused.
    ``latency_weight`` (global budget): each exchange (message) that the kept set opens is charged
    this many values in the ranking, not in the budget: a link that would open a new message ranks
    by score / (values + latency_weight), a link of an open one by score / values, so that on
    high-latency links the byte budget goes to fewer, fuller messages (the same bytes).
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
    if budget == "joint":
        return _joint(part, scores, ratio, cand, max_flops, max_weights_per_node, costs or link_costs(part))
    if latency_weight < 0:
        raise ValueError(f"latency_weight must be >= 0, got {latency_weight}")
    if latency_weight > 0:
        if budget != "global":
            raise ValueError(f"latency_weight works with the global budget, not {budget!r}")
        return _by_message(part, scores, ratio, cand, latency_weight)
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


def _by_message(part: Partition, scores: np.ndarray, ratio: float, cand: np.ndarray, weight: float) -> np.ndarray:
    """The global budget with a charge of ``weight`` values for every message opened (lazy greedy)."""
    import heapq

    from ..cost import link_exchanges

    vals = part.links.values.astype(np.float64)
    ex = link_exchanges(part)
    room = ratio * part.dense_values()
    opened = np.zeros(ex.max() + 1 if len(ex) else 0, dtype=bool)
    cands = np.nonzero(cand)[0]
    members: dict[int, list[int]] = {}
    for k in cands.tolist():
        members.setdefault(int(ex[k]), []).append(k)
    heap = [(-(scores[k] / (vals[k] + weight)), k) for k in cands.tolist()]
    heapq.heapify(heap)
    kept = np.zeros(part.n_links, dtype=bool)
    done = np.zeros(part.n_links, dtype=bool)  # taken, or did not fit
    cum = 0.0
    while heap:
        _, k = heapq.heappop(heap)
        if done[k]:
            continue
        done[k] = True
        if cum + vals[k] > room + 1e-9:
            continue
        kept[k] = True
        cum += vals[k]
        e = int(ex[k])
        if not opened[e]:  # the rest of its message is cheaper now: queue them again at the better rank
            opened[e] = True
            for m in members[e]:
                if not done[m]:
                    heapq.heappush(heap, (-(scores[m] / vals[m]), m))
    return kept


def joint_rooms(part: Partition, ratio: float, max_flops: float, max_weights_per_node: float,
                costs: LinkCosts) -> tuple[float, float, np.ndarray]:
    """Room left above the r = 0 floor: (byte values, FLOPs, weights per node); refuses infeasible caps."""
    if not 0 < max_flops <= 1 or not 0 < max_weights_per_node <= 1:
        raise ValueError(f"--max-flops and --max-weights-per-node are fractions of dense in (0, 1], got "
                         f"{max_flops} and {max_weights_per_node}")
    f_room = max_flops * costs.flops_dense - costs.flops_floor
    w_room = max_weights_per_node * costs.params_dense - costs.weights_floor
    if f_room < 0 or (w_room < 0).any():
        raise ValueError(
            f"the joint budget's caps cannot be met by any choice of links: with no link kept (r=0) the model "
            f"already needs {costs.flops_floor / costs.flops_dense:.3f}x the dense FLOPs (cap --max-flops "
            f"{max_flops}) and up to {costs.weights_floor.max() / costs.params_dense:.3f}x the weights on one node "
            f"(cap --max-weights-per-node {max_weights_per_node})")
    return ratio * part.dense_values(), float(f_room), w_room.astype(np.float64)


def joint_weights(part: Partition, ratio: float, max_flops: float, max_weights_per_node: float,
                  costs: LinkCosts) -> np.ndarray:
    """Each link's share of the three rooms it uses: bytes / byte room + FLOPs / FLOPs room + weights / its
    receiving node's weight room (the joint budget's capped quantities; a zero room counts as tiny)."""
    b_room, f_room, w_room = joint_rooms(part, ratio, max_flops, max_weights_per_node, costs)
    tiny = 1e-12
    vals = part.links.values.astype(np.float64)
    return (vals / max(b_room, tiny) + costs.flops / max(f_room, tiny)
            + costs.weights / np.maximum(w_room[part.links.receiver], tiny))


def _joint(part: Partition, scores: np.ndarray, ratio: float, cand: np.ndarray, max_flops: float,
           max_weights_per_node: float, costs: LinkCosts) -> np.ndarray:
    """Greedy fill by (score - price * resources) per byte; the price is the smallest that fills the bytes."""
    b_room, f_room, w_room = joint_rooms(part, ratio, max_flops, max_weights_per_node, costs)
    vals = part.links.values.astype(np.float64)
    recv = part.links.receiver
    tiny = 1e-12
    # the FLOPs and weights a link brings, as shares of the room the caps leave (a zero room: infinite)
    use = costs.flops / max(f_room, tiny) + costs.weights / np.maximum(w_room[recv], tiny)
    c_idx = np.nonzero(cand)[0]
    pos = scores[c_idx][scores[c_idx] > 0]
    s = scores / (np.median(pos) if len(pos) else 1.0)
    need = b_room - 0.005 * part.dense_values()  # the byte budget counts as filled within 0.5% of dense

    def fill(price: float) -> tuple[np.ndarray, float]:
        order = c_idx[np.argsort(-((s[c_idx] - price * use[c_idx]) / vals[c_idx]), kind="stable")]
        kept = np.zeros(part.n_links, dtype=bool)
        b = f = 0.0
        w = np.zeros(part.nodes)
        for k in order.tolist():
            j = recv[k]
            if (b + vals[k] <= b_room + 1e-9 and f + costs.flops[k] <= f_room + 1e-9
                    and w[j] + costs.weights[k] <= w_room[j] + 1e-9):
                kept[k] = True
                b += vals[k]
                f += costs.flops[k]
                w[j] += costs.weights[k]
        return kept, b

    best, best_b = fill(0.0)
    if best_b >= need:
        return best
    lo, hi = 0.0, None
    for price in 1e-3 * 2.0 ** np.arange(40):  # the smallest price (x2) at which the bytes fill ...
        kept, b = fill(float(price))
        if b > best_b:
            best, best_b = kept, b
        if b >= need:
            hi = float(price)
            break
        lo = float(price)
    if hi is not None:
        for _ in range(8):  # ... refined by bisection
            mid = 0.5 * (lo + hi)
            kept, b = fill(mid)
            if b >= need:
                hi, best, best_b = mid, kept, b
            else:
                lo = mid
    if best_b < need:
        msg = (f"joint budget: the FLOPs or weight caps bind before the byte budget fills; r = "
               f"{best_b / part.dense_values():.4f} instead of {ratio:.4f}")
        if msg not in _WARNED:  # gradual pruning selects every few steps: say it once per process
            _WARNED.add(msg)
            log.warning(msg)
    return best


_WARNED: set[str] = set()


def cubic_ratio(step: int, total: int, target_ratio: float) -> float:
    """Gradual pruning schedule: r goes from 1 to ``target_ratio`` along a cubic (Zhu & Gupta, 2017)."""
    frac = min(1.0, max(0.0, step / max(1, total)))
    return target_ratio + (1.0 - target_ratio) * (1.0 - frac) ** 3
